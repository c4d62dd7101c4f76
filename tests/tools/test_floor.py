"""The floor arithmetic of the goal table (``tools.floor``), one row by hand."""

from __future__ import annotations

import pytest

from tools import floor


def test_deit_tiny_cores_by_hand():
    # InLine-DeiT-T at B 128, 224 px: 12 layers of 197 tokens, C 192 = 6 heads of 32
    inline = floor.deit_step("inline", 128).attention[0]
    assert (inline.layers, inline.samples, inline.tokens, inline.channels, inline.head_dim) == (12, 128, 197, 192, 32)
    qkvo = 11 * 128 * 197 * 192 * 2 * 12  # Q, K, V, O forward; Q, K, V, dO, dQ, dK, dV backward; bf16
    taps = 3 * 9 * 128 * 192 * 2 * 12  # [B, 9, C] read forward, read and written backward
    assert floor.core_bytes(inline) == qkvo + taps == 1_294_073_856
    assert floor.attention_ms(inline) == pytest.approx(1_294_073_856 / 4.2e12 * 1e3)  # 0.308 ms: bytes bound
    # the softmax twin: 3 heads of 64, flash attention 4 N^2 d per head forward, 2.5x that backward
    flash = floor.deit_step("softmax", 128).attention[0]
    assert floor.core_flops(flash) == 3.5 * 4 * 197**2 * 64 * 3 * 128 * 12
    assert floor.core_bytes(flash) == qkvo
    assert floor.attention_ms(flash) == pytest.approx(qkvo / 4.2e12 * 1e3)  # 160 GFLOP = 0.16 ms < its bytes


def test_every_goal_row_has_its_goal_floor_and_arithmetic():
    rows = floor.goal_rows()
    assert len(rows) == 13  # the goal table's rows
    assert all(r["how"] and r["goal"] and r["floor"] for r in rows)
    lines = floor.table(rows)
    assert lines[0] == "| what | goal | at the floors | arithmetic |"
    assert len(lines) == 15
    deit = rows[0]["how"]
    assert "14.54 / (16.79 - 3.24 + 0.308) = 1.05x" in deit  # InLine's core at its floor, the profiled rest


def test_the_core_row_has_the_shapes_gpu_check_times():
    from tools.gpu_check import core

    assert floor.CORE_SHAPES == tuple((s.batch, s.tokens, s.heads * s.head_dim) for s in core.CORE_SHAPES)
