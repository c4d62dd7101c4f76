"""The Triton launchers' plans (:func:`inline_attn.ops.fused.triton._planned`): derived once per
key, a fresh one for anything the launch depends on (a new tuning table included), never more
than PLANS_MAX of them; and the layer core's step, planned once per direction.

The kernels are stubbed out (the host benchmark's stubs): only what the launchers plan and
launch is checked here; the kernels' results are tested in test_triton*.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from inline_attn.bench.host import stubbed_triton_launches
from inline_attn.ops.fused import op
from inline_attn.ops.fused import triton as triton_core

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HEADS = 2
N = 80  # tokens: two 64-row tiles, which split=2 splits


def _qkv(b: int, n: int, c: int, dtype=torch.float32, transposed: bool = False):
    """q, k, v [b, n, c] as views of one projection ([b, n, 3c], or a transposed [b, 3c, n] buffer)."""
    if transposed:
        return torch.randn(b, 3 * c, n, device=DEVICE).to(dtype).transpose(1, 2).chunk(3, dim=-1)
    return torch.randn(b, n, 3 * c, device=DEVICE).to(dtype).chunk(3, dim=-1)


def _step(q, k, v, split=None) -> list[tuple]:
    """The launches of the predictor's forward, the core's forward and backward and the
    predictor's backward on q, k, v: (kernel, grid, meta, arguments with each tensor as its dtype)."""
    b, n, c = q.shape
    taps = torch.randn(b, 9, c, device=DEVICE)
    w1, w2 = torch.randn(c, c // HEADS, device=DEVICE), torch.randn(9 * c, c // HEADS, device=DEVICE)
    b1, b2 = torch.randn(c, device=DEVICE), torch.randn(9 * c, device=DEVICE)
    with triton_core.record_launches() as log:
        ctx, _ = triton_core.predictor_forward_triton(q, w1, b1, w2, b2, HEADS)
        triton_core.inline_forward_triton(q, k, v, taps, HEADS, 0.5, 1, n, 0, split)
        triton_core.inline_backward_triton(q, k, v, taps, torch.ones_like(q), HEADS, 0.5, 1, n, 0, split)
        triton_core.predictor_backward_triton(ctx, taps, w1, b1, w2, n, HEADS)
    return [(x.kernel, x.grid, x.meta, x.args) for x in log]


@pytest.fixture
def plans(monkeypatch):
    """No plans to begin with (the test's own, restored after it); the kernels stubbed out."""
    monkeypatch.setattr(triton_core, "_plans", {})
    with stubbed_triton_launches():
        yield triton_core._plans


def test_a_step_is_planned_once_and_launches_as_planned(plans):
    q, k, v = _qkv(2, N, 32)
    first = _step(q, k, v)
    assert len(plans) == 4  # one plan per launcher
    again = _step(*_qkv(2, N, 32))  # new tensors of the same kind: looked up, not planned again
    assert len(plans) == 4 and again == first
    assert [x[0] for x in first] == ["predictor_fwd", "inline_fwd_stream", "inline_bwd_stream", "predictor_bwd"]


def _with(settings) -> list[tuple]:
    """A step on tensors like _qkv(2, N, 32)'s inside ``settings`` (a context manager)."""
    with settings:
        return _step(*_qkv(2, N, 32))


# what may change between two layer steps on tensors like _qkv(2, N, 32)'s: the steps with it changed
CHANGES = {
    "batch": lambda: _step(*_qkv(3, N, 32)),
    "tokens": lambda: _step(*_qkv(2, N + 1, 32)),
    "strides": lambda: _step(*_qkv(2, N, 32, transposed=True)),
    "dtype": lambda: _step(*_qkv(2, N, 32, torch.bfloat16)),
    "split": lambda: _step(*_qkv(2, N, 32), split=2),
    "core kernels": lambda: _with(triton_core.core_kernels("resident")),
    "tiling": lambda: _with(triton_core.forced_tiling(16, 1)),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_anything_the_launch_depends_on_gets_a_fresh_plan(plans, change):
    step = CHANGES[change]
    base = _step(*_qkv(2, N, 32))
    before = set(plans)
    changed = step()
    assert changed != base
    new_core_plans = [key for key in set(plans) - before if key[0][0] in ("inline_fwd", "inline_bwd")]
    assert len(new_core_plans) == 2, new_core_plans  # the core's forward and backward planned afresh
    plans.clear()
    assert step() == changed  # what the launchers plan without a cache


def test_the_launches_carry_the_planned_grid_and_strides(plans):
    q, k, v = _qkv(3, N, 32, transposed=True)
    kernel, grid, _, args = _step(q, k, v)[1]
    assert kernel == "inline_fwd_stream" and grid == (3 * HEADS,)
    assert args[5:8] == (q.stride(), k.stride(), v.stride())


def test_the_cache_keeps_at_most_plans_max_newest_first(plans, monkeypatch):
    monkeypatch.setattr(triton_core, "PLANS_MAX", 6)
    for b in range(1, 6):  # a batch size a call: 4 plans each, 20 in all
        _step(*_qkv(b, N, 32))
        assert len(plans) <= 6
    newest = list(plans)[-4:]  # the last step's four plans were kept
    assert {key[0][1] if key[0][0].startswith("inline") else key[0][1][0] for key in newest} == {5}


def _fake_tensor() -> torch.Tensor:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return torch.empty(2, 16, 32)


@pytest.mark.parametrize("planning", ["simulated device", "traced graph"])
def test_plans_are_not_kept_for_a_simulated_device_or_a_traced_graph(plans, monkeypatch, planning):
    if planning == "simulated device":
        monkeypatch.setitem(triton_core._state, "simulated", triton_core.DeviceLimits("simulated", 8, 100_000))
        args = (torch.empty(2, 16, 32, device="meta"),)
    else:
        args = (_fake_tensor(),)
    built = []

    def build(args):
        built.append(args)
        return len(built)

    assert [triton_core._planned(("key",), build, args) for _ in range(2)] == [1, 2]
    assert plans == {}


def test_a_new_tuning_table_gets_fresh_plans(plans, monkeypatch, tmp_path):
    q, k, v = _qkv(2, N, 32)
    with triton_core.core_kernels("tiled"):  # the fused launch: its tile is the table's
        before = _step(q, k, v)
        name = triton_core.device_limits(q.device).name
        table = {triton_core.tuning_key(name, N, 32 // HEADS, HEADS, torch.float32): {"BLOCK_N": 16, "num_warps": 1}}
        path = tmp_path / "triton_tuning.json"
        path.write_text(json.dumps({"winners": table}))
        monkeypatch.setattr(triton_core, "TUNING_FILE", path)
        after = _step(q, k, v)
    assert [launch[2]["BLOCK_N"] for launch in before if "BLOCK_N" in launch[2]] == [64, 64]
    assert [launch[2]["BLOCK_N"] for launch in after if "BLOCK_N" in launch[2]] == [16, 16]


def _layer_step(x, q, k, v) -> None:
    """One layer core step (forward and backward) on the Triton path."""
    c = q.shape[-1]
    params = [
        torch.randn(s, device=DEVICE, requires_grad=True)
        for s in [(c, c // HEADS, 1), (c,), (9 * c, c // HEADS, 1), (9 * c,)]
    ]
    out = op.inline_layer_core(x, q, k, v, *params, HEADS, 0.5, 1, q.shape[1], 0, "triton")
    out.backward(torch.ones_like(out))


def test_a_layer_step_plans_each_direction_once_per_key(plans):
    q, k, v = (t.requires_grad_() for t in _qkv(2, N, 32))
    x = torch.randn(2, N, 32, device=DEVICE)
    _layer_step(x, q, k, v)
    _layer_step(x.clone(), q, k, v)  # the same kinds of tensors: looked up
    assert sorted(key[0][0] for key in plans) == ["layer_bwd", "layer_fwd"]
    _layer_step(x.transpose(1, 2).contiguous().transpose(1, 2), q, k, v)  # x token-strided: a new forward plan
    assert sorted(key[0][0] for key in plans) == ["layer_bwd", "layer_fwd", "layer_fwd"]
