"""The host path of one InLine layer step: what it calls, not how long it takes (that is the
benchmark's job, ``python -m inline_attn.bench.host``; docs/benchmarks.md has its numbers)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.overrides import TorchFunctionMode

from inline_attn.bench.host import (
    CASES,
    bench_host,
    layer_steps,
    model_steps,
    python_calls,
    stubbed_triton_launches,
)
from inline_attn.ops.fused import cpu as cpu_kernel

needs_cpu_kernel = pytest.mark.skipif(not cpu_kernel.cpu_kernel_available(), reason="the C++ kernel did not build")


class IdleCasts(TorchFunctionMode):
    """Counts the casts and copies (``to``, ``float``, ``contiguous``) that return their input:
    each costs a dispatch and does nothing."""

    METHODS = {torch.Tensor.to, torch.Tensor.float, torch.Tensor.contiguous}

    def __init__(self):
        super().__init__()
        self.idle = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.METHODS and out is args[0]:
            self.idle += 1
        return out


# The Python functions of this package a C++-path layer step calls (fwd + bwd), each once: the
# layer's forward and projection, its grid check, the path's choice, and the call of the C++ op
# (whose forward, backward and autograd node are C++: no Python below ``inline_layer_core``).
CPU_STEP_CALLS = {
    "attention.py:forward",
    "attention.py:_project",
    "_checks.py:check_feat_size",
    "record.py:attend_predicted",
    "local_residual.py:predictor_params",
    "tokens.py:layer_core_tokens",
    "dispatch.py:choose",
    "dispatch.py:check_impl",
    "dispatch.py:unsupported",
    "dispatch.py:tracing_reason",
    "dispatch.py:in_onnx_export",
    "dispatch.py:_in_functorch_transform",
    "dispatch.py:_feature_map_name",
    "cpu.py:cpu_kernel_available",
    "cpu.py:_load",
    "op.py:runs_as_custom_op",
    "op.py:inline_layer_core",
}
OUR_FILES = ("attention.py", "_checks.py", "record.py", "local_residual.py", "tokens.py", "dispatch.py", "cpu.py")
OUR_FILES += ("op.py", "predictor.py", "triton.py")


@needs_cpu_kernel
def test_cpu_layer_step_calls_no_python_below_the_layer_and_casts_nothing_idle():
    """The C++ path's layer step: the grid is checked once (the layer's forward), the path chosen
    once, then one call of the C++ layer op; its backward runs no Python, and no cast does nothing."""
    step = layer_steps(["inline-cpu"])["inline-cpu"]
    step()  # builds the kernel, warms the caches
    calls = python_calls(step)
    ours = {name: n for name, n in calls.items() if name.split(":")[0] in OUR_FILES and "<genexpr>" not in name}
    print(sorted(ours.items()))
    assert ours == dict.fromkeys(CPU_STEP_CALLS, 1)
    with IdleCasts() as mode:
        step()
    assert mode.idle == 0


def test_triton_layer_step_with_stubbed_launches():
    """The Triton path's layer step with its launches stubbed out: four kernels (predictor and
    core, each way), the same single checks as the C++ path."""
    pytest.importorskip("triton")
    from inline_attn.ops.fused import triton as triton_core

    step = layer_steps(["inline-triton-stub"])["inline-triton-stub"]
    with stubbed_triton_launches(), triton_core.record_launches() as launched:
        step()
        calls = python_calls(step)
    assert sorted(x.kernel for x in launched) == sorted(
        ["predictor_fwd", "inline_fwd_resident", "inline_bwd_stream", "predictor_bwd"] * 2
    )
    assert calls["_checks.py:check_feat_size"] == 1 and calls["dispatch.py:choose"] == 1
    assert "_checks.py:check_tokens" not in calls
    # the layer core's Python: one autograd.Function each way around one planned direction of the
    # layer step (a plan lookup, the output buffers, the predictor's and the core's launch), nothing else
    log = ("triton.py:_dtypes", "triton.py:<genexpr>")  # what the open launch log records
    core = {
        n: k for n, k in calls.items() if n.split(":")[0] in ("op.py", "predictor.py", "triton.py") and n not in log
    }
    assert core == {
        "op.py:runs_as_custom_op": 1,
        "op.py:inline_layer_core": 1,
        "op.py:forward": 1,
        "op.py:backward": 1,
        "op.py:_no_double_backward": 1,
        "triton.py:interpreting": 1,  # the path's choice: Triton's mode (dispatch.py)
        "triton.py:layer_forward_triton": 1,
        "triton.py:layer_backward_triton": 1,
        "triton.py:_planned": 2,
        "triton.py:_out_dtype": 2,
        "triton.py:_launch": 4,
        "triton.py:traced": 6,  # one check a lookup and a launch
    }, core


@needs_cpu_kernel
def test_bench_host_reports_every_case_against_sdpa():
    pytest.importorskip("triton")
    result = bench_host(repeats=2)
    rows = {r["case"]: r for r in result["rows"]}
    assert set(rows) == set(CASES)
    assert rows["sdpa"]["ratio"] == 1.0
    assert all(r["median_us"] > 0 for r in rows.values()), rows


def test_model_step_with_stubbed_launches_runs_no_kernel():
    """A whole model's step on the Triton path: each block's predictor and core launch each way, every
    one of them skipped by a stub (no kernel ran)."""
    pytest.importorskip("triton")
    from inline_attn.ops.fused import triton as triton_core

    step = model_steps(["inline-triton-stub"], depth=2)["inline-triton-stub"]
    with stubbed_triton_launches() as skipped, triton_core.record_launches() as launched:
        step()
    assert len(launched) == 2 * 4
    assert skipped == Counter(x.kernel for x in launched)


@needs_cpu_kernel
def test_bench_host_model_reports_inline_paths_against_the_softmax_model():
    pytest.importorskip("triton")
    cases = ["sdpa", "inline-cpu", "inline-triton-stub"]
    steps = model_steps(cases, depth=2)
    layer_cores = {case: python_calls(steps[case])["op.py:inline_layer_core"] for case in ("sdpa", "inline-cpu")}
    assert layer_cores == {"sdpa": 0, "inline-cpu": 2}  # the softmax model has no InLine layer
    result = bench_host(cases, repeats=2, model="inline_deit_tiny", depth=1)
    rows = {r["case"]: r for r in result["rows"]}
    assert list(rows) == cases and rows["sdpa"]["ratio"] == 1.0
    assert all(r["median_us"] > 0 for r in rows.values()), rows
    assert result["meta"]["model"] == "inline_deit_tiny" and result["meta"]["depth"] == 1
