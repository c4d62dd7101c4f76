"""The Triton launcher's tuned launch shapes: read from the committed table, applied per key, and
still exact (outputs and gradients against float64) with a tuned tile; bad tables are refused."""

from __future__ import annotations

import json

import pytest
import torch

from inline_attn.ops import inline_tokens
from inline_attn.ops.fused import triton as triton_core

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _table(tmp_path, monkeypatch, winners: dict):
    path = tmp_path / "triton_tuning.json"
    path.write_text(json.dumps({"winners": winners}))
    monkeypatch.setattr(triton_core, "TUNING_FILE", path)
    triton_core._tuning_table.cache_clear()
    return path


def _spy_launches(monkeypatch) -> list[dict]:
    """The launch options (BLOCK_N, num_warps, ...) of every Triton launch from now on."""
    seen: list[dict] = []
    launch = triton_core._launch

    def spy(kernel, grid, *args, **meta):
        seen.append(meta)
        launch(kernel, grid, *args, **meta)

    monkeypatch.setattr(triton_core, "_launch", spy)
    return seen


def test_committed_table_is_valid():
    table = json.loads(triton_core.TUNING_FILE.read_text())
    assert set(table) == {"about", "winners"}
    triton_core._tuning_table.cache_clear()
    assert triton_core._tuning_table(str(triton_core.TUNING_FILE)) == table["winners"]


def test_keys_name_gpu_bucket_head_dim_heads_dtype():
    assert triton_core.token_bucket(49) == 64 and triton_core.token_bucket(196) == 256
    assert triton_core.tuning_key("NVIDIA H100", 196, 32, 3, torch.bfloat16) == "NVIDIA H100|256|32|3|bfloat16"


@pytest.mark.parametrize("split", [1, 3], ids=["fused-launch", "split-launch"])
def test_tuned_tile_is_used_and_exact(tmp_path, monkeypatch, split):
    b, h, w, heads, d, p = 2, 5, 7, 2, 32, 1
    n, c = p + h * w, heads * d
    name = triton_core.device_limits(torch.device(DEVICE)).name
    _table(
        tmp_path,
        monkeypatch,
        {triton_core.tuning_key(name, n, d, heads, torch.float32): {"BLOCK_N": 16, "num_warps": 1}},
    )
    monkeypatch.setattr(triton_core, "_split", lambda *a: split)
    monkeypatch.setitem(triton_core._state, "resident", False)  # the table tiles the fused / split launches
    launches = _spy_launches(monkeypatch)
    base = torch.randn(b, n, 3 * c, dtype=torch.float64, device=DEVICE)
    q, k, v = base.float().requires_grad_().chunk(3, dim=-1)
    taps = torch.randn(b, c, 3, 3, device=DEVICE, requires_grad=True)
    kw = dict(num_heads=heads, feat_size=(h, w), num_prefix_tokens=p)
    out = inline_tokens(q, k, v, residual_weights=taps, impl="triton", **kw)
    q64, k64, v64 = base.clone().requires_grad_().chunk(3, dim=-1)
    t64 = taps.detach().double().requires_grad_()
    ref = inline_tokens(q64, k64, v64, residual_weights=t64, impl="naive", **kw)
    g = torch.randn_like(ref)
    got = torch.autograd.grad(out, (q, k, v, taps), g.float())
    want = torch.autograd.grad(ref, (q64, k64, v64, t64), g)
    tiles = [m["BLOCK_N"] for m in launches if "BLOCK_N" in m]  # the predictor's launches have no tile
    assert 16 in tiles and 64 not in tiles, tiles
    rel = [((a.double() - r).norm() / r.norm()).item() for a, r in zip((out, *got), (ref, *want))]
    assert max(rel[:1]) < 2e-6 and max(rel[1:]) < 1e-5, rel


def test_untuned_shapes_keep_the_defaults(tmp_path, monkeypatch):
    _table(tmp_path, monkeypatch, {})
    q = torch.empty(1, 1, 64, device=DEVICE)
    assert triton_core.tiling(q, 196, 32, 2) == (triton_core.BLOCK_N, triton_core.NUM_WARPS)
    assert triton_core.tiling(q, 196, 64, 1) == (triton_core.BLOCK_N, 2 * triton_core.NUM_WARPS)


def test_bad_table_entry_is_a_clear_error(tmp_path, monkeypatch):
    path = _table(tmp_path, monkeypatch, {"x|64|32|3|float32": {"BLOCK_N": 48, "num_warps": 2}})
    with pytest.raises(ValueError, match="needs BLOCK_N in"):
        triton_core._tuning_table(str(path))


def test_forced_tiling_applies_inside_its_block_only(monkeypatch):
    launches = _spy_launches(monkeypatch)
    q, k, v = torch.randn(1, 9, 3 * 32, device=DEVICE).chunk(3, dim=-1)
    kw = dict(num_heads=2, feat_size=(3, 3), impl="triton")
    with triton_core.forced_tiling(32, 8):
        forced = inline_tokens(q, k, v, **kw)
    inline_tokens(q, k, v, **kw)
    assert launches[0]["num_warps"] == 8 and launches[-1]["num_warps"] != 8
    torch.testing.assert_close(forced, inline_tokens(q, k, v, **kw))
    with pytest.raises(ValueError, match="BLOCK_N in"):
        with triton_core.forced_tiling(48, 2):
            pass
