"""The Triton kernels keep a GPU busy: occupancy and spills from the compiled kernels, no GPU needed.

The launchers plan the bf16 training step of InLine-DeiT-T's layer (batch 128), Swin-T's first
stage at windows of 7 (4,096 windows) and a 14 x 14 map (batch 256); every kernel they choose is
compiled for sm_80 / 86 / 89 / 90 through the ``ptxas`` in triton's wheel
(``python -m tools.kernel_audit --occupancy``, in a subprocess: this process
interprets). Resident warps per multiprocessor follow from the registers (65,536 per SM, allocated
per warp in units of 256), the warps per program, the shared memory and the target's limits.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("triton")

TARGETS = ("sm_80", "sm_86", "sm_89", "sm_90")

REPO = pathlib.Path(__file__).resolve().parents[2]  # `python -m tools.kernel_audit` runs from the repository root


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("occupancy")
    env = dict(os.environ, TRITON_INTERPRET="0")
    cmd = [sys.executable, "-m", "tools.kernel_audit", "--occupancy", "--out", str(out)]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=1200)
    print(proc.stdout[-4000:], proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "occupancy.json").read_text())


def test_one_streaming_kernel_and_one_predictor_kernel_each_way_at_every_shape(rows):
    for target in TARGETS:
        for shape in ("DeiT-T", "Swin 7x7", "14x14"):
            kernels = sorted(r["kernel"] for r in rows if r["target"] == target and r["shape"] == shape)
            assert kernels == ["inline_bwd_stream", "inline_fwd_stream", "predictor_bwd", "predictor_fwd"], kernels


def test_no_kernel_spills_on_any_target(rows):
    spilling = [(r["target"], r["shape"], r["kernel"], r["spills"]) for r in rows if r["spills"]]
    assert spilling == []
    assert {r["target"] for r in rows} == set(TARGETS)


def test_core_kernels_keep_24_warps_forward_and_16_backward_resident_on_sm_90(rows):
    core = [r for r in rows if r["target"] == "sm_90" and r["kernel"].startswith("inline_")]
    assert len(core) == 6
    for r in core:
        goal = 24 if r["kernel"].startswith("inline_fwd") else 16
        assert r["goal"] == goal and r["resident_warps"] >= goal, r


def test_resident_warps_follow_registers_warps_and_shared_memory():
    from tools.kernel_audit import TARGETS as T
    from tools.kernel_audit import resident_warps

    sm90, sm86 = T[3], T[1]
    assert resident_warps(sm90, 80, 8, 10_240) == 24  # 80 * 32 * 8 = 20,480 registers a program: 3 fit
    assert resident_warps(sm90, 128, 8, 16_384) == 16
    assert resident_warps(sm90, 181, 8, 0) == 8  # 184 allocated: 47,104 a program
    assert resident_warps(sm86, 32, 8, 0) == 48  # the target's 48 warps bound it
    assert resident_warps(sm90, 32, 4, 100_000) == 8  # shared memory: two programs
