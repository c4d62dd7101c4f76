"""The Triton launcher's tuned launches: the committed table's designs and parameters applied per key
and direction (explicit core kernels and forced choices winning over them), still exact (outputs and
gradients against float64) with each design's non-default parameters; bad tables are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from inline_attn.bench.host import stubbed_triton_launches
from inline_attn.ops import inline_tokens
from inline_attn.ops.fused import triton as triton_core
from inline_attn.ops.fused.core_choice import CoreChoice

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _table(tmp_path, monkeypatch, winners: dict):
    path = tmp_path / "triton_tuning.json"
    path.write_text(json.dumps({"winners": winners}))
    monkeypatch.setattr(triton_core, "TUNING_FILE", path)
    triton_core._tuning_table.cache_clear()
    triton_core._tuned_choices.cache_clear()
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


BAD_ENTRIES = {
    "a tile off the list": ({"BLOCK_N": 48, "num_warps": 2}, "fused design: BLOCK_N 48, expected one of"),
    "no warps": ({"design": "stream", "BLOCK_N": 32}, "needs num_warps"),
    "an unknown design": ({"design": "flash", "num_warps": 4}, "core design 'flash': expected one of"),
    "a resident tile": ({"design": "resident", "BLOCK_N": 64, "num_warps": 4}, "its tile is the whole problem"),
    "odd warps": ({"design": "resident", "num_warps": 3}, "num_warps 3, expected one of"),
    "a misspelt key": ({"BLOCK_N": 64, "num_warp": 2}, r"unknown keys \['num_warp'\]"),
    "taps of a fused choice": ({"BLOCK_N": 64, "num_warps": 2, "serial_taps": True}, "only the resident design has it"),
    "taps not a bool": ({"design": "resident", "num_warps": 8, "serial_taps": "on"}, "serial_taps 'on', expected True"),
    "one direction": ({"forward": {"design": "resident", "num_warps": 4}}, "has 'forward' and 'backward' only"),
    "a bad direction": (
        {"forward": {"design": "resident", "num_warps": 4}, "backward": {"BLOCK_N": 8, "num_warps": 2}},
        "'x|64|32|3|float32' backward: fused design: BLOCK_N 8",
    ),
}


@pytest.mark.parametrize("bad", list(BAD_ENTRIES))
def test_bad_table_entry_is_a_clear_error(tmp_path, monkeypatch, bad):
    entry, message = BAD_ENTRIES[bad]
    path = _table(tmp_path, monkeypatch, {"x|64|32|3|float32": entry})
    with pytest.raises(ValueError, match=message) as err:
        triton_core._tuning_table(str(path))
    assert str(path) in str(err.value)


def test_forced_tiling_applies_inside_its_block_only(monkeypatch):
    launches = _spy_launches(monkeypatch)
    q, k, v = torch.randn(1, 9, 3 * 32, device=DEVICE).chunk(3, dim=-1)
    kw = dict(num_heads=2, feat_size=(3, 3), impl="triton")
    with triton_core.forced_tiling(32, 1):  # the fused launch's tiles (the streaming kernels have their own)
        forced = inline_tokens(q, k, v, **kw)
    inline_tokens(q, k, v, **kw)
    assert launches[0]["num_warps"] == 1 and launches[-1]["num_warps"] != 1
    torch.testing.assert_close(forced, inline_tokens(q, k, v, **kw))
    with pytest.raises(ValueError, match="BLOCK_N 48, expected one of"):
        with triton_core.forced_tiling(48, 2):
            pass


def _core_launches(n: int, d: int, heads: int = 2) -> list[tuple]:
    """(kernel, num_warps, BLOCK_N) of the core's forward and backward launches on fp32 tensors of
    n tokens (one row), the kernels stubbed out: what the launchers choose, not what they compute."""
    q = torch.randn(2, n, heads * d, device=DEVICE)
    taps = torch.randn(2, 9, heads * d, device=DEVICE)
    with stubbed_triton_launches(), triton_core.record_launches() as log:
        triton_core.inline_forward_triton(q, q, q, taps, heads, 0.5, 1, n, 0)
        triton_core.inline_backward_triton(q, q, q, taps, q, heads, 0.5, 1, n, 0)
    return [(x.kernel, x.meta["num_warps"], x.meta.get("BLOCK_N")) for x in log]


def _tuned(tmp_path, monkeypatch, entry: dict, n: int = 36, d: int = 16, heads: int = 2) -> None:
    """A table whose only entry is ``entry``, for launches like :func:`_core_launches`' (no plans kept)."""
    monkeypatch.setattr(triton_core, "_plans", {})
    name = triton_core.device_limits(torch.device(DEVICE)).name
    _table(tmp_path, monkeypatch, {triton_core.tuning_key(name, n, d, heads, torch.float32): entry})


RESIDENT_4 = {"design": "resident", "num_warps": 4}
STREAM_16 = {"design": "stream", "BLOCK_N": 16, "num_warps": 2}
# entry -> the core's forward and backward launches (kernel, warps, tile); the defaults at this
# shape (36 tokens): the resident forward (2 warps) and the streaming backward (fp32: 16 rows, 8 warps)
TABLE_LAUNCHES = {
    "resident": (RESIDENT_4, [("inline_fwd_resident", 4, None), ("inline_bwd_resident", 4, None)]),
    "stream": (STREAM_16, [("inline_fwd_stream", 2, 16), ("inline_bwd_stream", 2, 16)]),
    "fused": ({"BLOCK_N": 32, "num_warps": 1, "ms": 0.5}, [("inline_fwd_fused", 1, 32), ("inline_bwd_fused", 1, 32)]),
    "per direction": (
        {"forward": {"design": "fused", "BLOCK_N": 16, "num_warps": 4}, "backward": RESIDENT_4},
        [("inline_fwd_fused", 4, 16), ("inline_bwd_resident", 4, None)],
    ),
}


def test_without_an_entry_the_default_design_launches(tmp_path, monkeypatch):
    _tuned(tmp_path, monkeypatch, RESIDENT_4, n=200)  # another key
    assert _core_launches(36, 16) == [("inline_fwd_resident", 2, None), ("inline_bwd_stream", 8, 16)]


# (tokens, head dim) -> the defaults' launches in fp32 (no table entry): the resident forward up to
# 64 tokens, the streaming kernels up to AUTO_STREAM_TOKENS, beyond it the resident launch where its
# tile fits (8,192 elements: 512 rows of 16) and the fused one where it does not (512 rows of 32)
AUTO_LAUNCHES = {
    (36, 16): [("inline_fwd_resident", 2, None), ("inline_bwd_stream", 8, 16)],
    (100, 16): [("inline_fwd_stream", 8, 32), ("inline_bwd_stream", 8, 16)],
    (256, 16): [("inline_fwd_stream", 8, 32), ("inline_bwd_stream", 8, 16)],
    (300, 16): [("inline_fwd_resident", 8, None), ("inline_bwd_resident", 8, None)],
    (300, 32): [("inline_fwd_fused", 2, 64), ("inline_bwd_fused", 2, 64)],
}


@pytest.mark.parametrize("n, d", list(AUTO_LAUNCHES))
def test_the_default_design_follows_the_token_count(tmp_path, monkeypatch, n, d):
    _tuned(tmp_path, monkeypatch, RESIDENT_4, n=2000)  # another key
    assert triton_core.AUTO_STREAM_TOKENS == 256
    assert _core_launches(n, d) == AUTO_LAUNCHES[n, d]


@pytest.mark.parametrize("design", list(TABLE_LAUNCHES))
def test_the_table_entrys_design_launches_with_its_parameters(tmp_path, monkeypatch, design):
    entry, launches = TABLE_LAUNCHES[design]
    _tuned(tmp_path, monkeypatch, entry)
    assert _core_launches(36, 16) == launches


@pytest.mark.parametrize(
    "entry, n, d",
    [(RESIDENT_4, 300, 32), (STREAM_16, 36, 128)],
    ids=["resident-over-its-tile", "stream-without-a-tile-at-head-dim-128"],
)
def test_an_entry_that_does_not_fit_falls_back_to_the_default_rule(tmp_path, monkeypatch, entry, n, d):
    _tuned(tmp_path, monkeypatch, entry, n=n, d=d)
    fused = triton_core.BLOCK_N, triton_core.NUM_WARPS * (1 if d <= 32 else 2)
    assert _core_launches(n, d) == [("inline_fwd_fused", fused[1], fused[0]), ("inline_bwd_fused", fused[1], fused[0])]


def test_an_entry_whose_tile_does_not_fit_the_shared_memory_falls_back_to_the_default_rule(tmp_path, monkeypatch):
    _tuned(tmp_path, monkeypatch, STREAM_16)
    fit = triton_core._fit

    def no_room_for_streaming(kernel, args, meta, what):  # as a GPU whose shared memory the stream tiles overflow
        if kernel.fn.__name__.endswith("_stream"):
            raise ValueError(f"no launch configuration of {kernel.fn.__name__} fits")
        return fit(kernel, args, meta, what)

    monkeypatch.setattr(triton_core, "_fit", no_room_for_streaming)  # the defaults' streaming backward too
    assert _core_launches(36, 16) == [("inline_fwd_resident", 2, None), ("inline_bwd_resident", 2, None)]


def test_explicit_core_kernels_beat_the_table_and_keep_its_parameters_for_their_own_design(tmp_path, monkeypatch):
    _tuned(tmp_path, monkeypatch, STREAM_16)
    with triton_core.core_kernels("resident"):
        assert _core_launches(36, 16) == [("inline_fwd_resident", 2, None), ("inline_bwd_resident", 2, None)]
    with triton_core.core_kernels("stream"):  # the table's design: its tile and warps
        assert _core_launches(36, 16) == [("inline_fwd_stream", 2, 16), ("inline_bwd_stream", 2, 16)]
    with triton_core.core_kernels("tiled"):
        assert _core_launches(36, 16) == [("inline_fwd_fused", 2, 64), ("inline_bwd_fused", 2, 64)]
    assert _core_launches(36, 16)[0] == ("inline_fwd_stream", 2, 16)  # outside: the table again


def test_a_forced_choice_beats_the_table_and_explicit_core_kernels(tmp_path, monkeypatch):
    _tuned(tmp_path, monkeypatch, RESIDENT_4)
    with triton_core.core_kernels("tiled"), triton_core.forced_core(CoreChoice("stream", 8, 32)):
        assert _core_launches(36, 16) == [("inline_fwd_stream", 8, 32), ("inline_bwd_stream", 8, 32)]


def test_a_forced_choice_leaves_no_state_behind(monkeypatch):
    monkeypatch.setattr(triton_core, "_plans", {})
    outer, inner = CoreChoice("resident", 4), CoreChoice("fused", 1, 16)
    with pytest.raises(RuntimeError, match="inside"):
        with triton_core.forced_core(outer):
            with triton_core.forced_core(inner):
                assert triton_core.core_choice(torch.empty(1, 1, 1), 36, 16, 2, backward=True) == inner
                raise RuntimeError("inside")
    assert triton_core._state["forced"] is None
    with triton_core.forced_core(outer):
        with pytest.raises(RuntimeError), triton_core.forced_core(inner):
            raise RuntimeError("inside")
        assert triton_core._state["forced"] == outer
    with pytest.raises(ValueError, match="expected a CoreChoice"), triton_core.forced_core(("fused", 1, 16)):
        pass


# a non-default parameter set of each design, forced: the core's kernels it launches
FORCED = {
    "resident 4 warps": (CoreChoice("resident", 4), ["inline_fwd_resident", "inline_bwd_resident"]),
    "resident 2 warps serial taps": (
        CoreChoice("resident", 2, serial_taps=True),
        ["inline_fwd_resident", "inline_bwd_resident"],
    ),
    "stream 64 rows 2 warps": (CoreChoice("stream", 2, 64), ["inline_fwd_stream", "inline_bwd_stream"]),
    "fused 32 rows 4 warps": (CoreChoice("fused", 4, 32), ["inline_fwd_fused", "inline_bwd_fused"]),
}


@pytest.mark.parametrize("forced", list(FORCED))
def test_each_forced_design_runs_with_its_parameters_and_is_exact(monkeypatch, forced):
    choice, kernels = FORCED[forced]
    b, h, w, heads, d, p = 2, 5, 7, 2, 32, 1
    n, c = p + h * w, heads * d
    base = torch.randn(b, n, 3 * c, dtype=torch.float64, device=DEVICE)
    q, k, v = base.float().requires_grad_().chunk(3, dim=-1)
    taps = torch.randn(b, c, 3, 3, device=DEVICE, requires_grad=True)
    kw = dict(num_heads=heads, feat_size=(h, w), num_prefix_tokens=p)
    with triton_core.forced_core(choice), triton_core.record_launches() as log:
        out = inline_tokens(q, k, v, residual_weights=taps, impl="triton", **kw)
        g = torch.randn(out.shape, dtype=torch.float64, device=DEVICE)
        got = torch.autograd.grad(out, (q, k, v, taps), g.float())
    core = [x for x in log if x.kernel.startswith("inline_")]
    assert [x.kernel for x in core] == kernels
    assert all(x.meta["num_warps"] == choice.num_warps and x.meta.get("BLOCK_N") == choice.block_n for x in core)
    # the resident forward's taps: the choice's, else its rule's (three at a time below the largest tile)
    assert [x.meta["SERIAL_TAPS"] for x in core if x.kernel == "inline_fwd_resident"] == (
        [bool(choice.serial_taps)] if choice.design == "resident" else []
    )
    q64, k64, v64 = base.clone().requires_grad_().chunk(3, dim=-1)
    t64 = taps.detach().double().requires_grad_()
    ref = inline_tokens(q64, k64, v64, residual_weights=t64, impl="naive", **kw)
    want = torch.autograd.grad(ref, (q64, k64, v64, t64), g)
    rel = [((a.double() - r).norm() / r.norm()).item() for a, r in zip((out, *got), (ref, *want))]
    assert max(rel[:1]) < 2e-6 and max(rel[1:]) < 1e-5, rel


def test_the_environment_variable_chooses_the_core_kernels_explicitly():
    code = "from inline_attn.ops.fused import triton as t; print(t._state['core'], t._state['core_chosen'])"
    env = {k: v for k, v in os.environ.items() if k != "INLINE_ATTN_TRITON_CORE"}
    runs = {}
    for setting in (None, "stream"):
        run_env = env if setting is None else {**env, "INLINE_ATTN_TRITON_CORE": setting}
        proc = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[setting] = proc.stdout.split()
    assert runs == {None: ["auto", "False"], "stream": ["stream", "True"]}  # set: it beats the tuning table


def test_an_unknown_core_kernels_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(triton_core, "_plans", {})
    monkeypatch.setitem(triton_core._state, "core", "fast")  # as INLINE_ATTN_TRITON_CORE=fast sets it
    with pytest.raises(ValueError, match=r"INLINE_ATTN_TRITON_CORE='fast': expected one of \('auto', 'stream'"):
        _core_launches(36, 16)
