"""The host path of one InLine layer step: what it calls, not how long it takes (that is the
benchmark's job, ``python -m inline_attn.bench.host``; docs/benchmarks.md has its numbers)."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from inline_attn.bench.host import CASES, bench_host, layer_steps, python_calls, stubbed_triton_launches
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


@needs_cpu_kernel
def test_cpu_layer_step_checks_once_and_casts_nothing_idle():
    """The C++ path's layer step: the grid is checked once (the layer's forward), the path chosen
    once, no token or predictor check repeated below the layer, and no cast that does nothing."""
    step = layer_steps(["inline-cpu"])["inline-cpu"]
    step()  # builds the kernel, warms the caches
    calls = python_calls(step)
    print(sorted(calls.items()))
    assert calls["_checks.py:check_feat_size"] == 1
    assert calls["dispatch.py:choose"] == 1
    assert not {"_checks.py:check_tokens", "_checks.py:check_tensor", "_checks.py:check_num_heads"} & set(calls)
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
        ["predictor_fwd", "inline_fwd_resident", "inline_bwd_resident", "predictor_bwd_samples"] * 2
    )
    assert calls["_checks.py:check_feat_size"] == 1 and calls["dispatch.py:choose"] == 1
    assert "_checks.py:check_tokens" not in calls


@needs_cpu_kernel
def test_bench_host_reports_every_case_against_sdpa():
    pytest.importorskip("triton")
    result = bench_host(repeats=2)
    rows = {r["case"]: r for r in result["rows"]}
    assert set(rows) == set(CASES)
    assert rows["sdpa"]["ratio"] == 1.0
    assert all(r["median_us"] > 0 for r in rows.values()), rows
