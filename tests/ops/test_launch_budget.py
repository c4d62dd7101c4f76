"""Kernel launches of one layer's forward + backward under bf16 autocast: InLine against SDPA.

A small layer's GPU step waits on the host's launches (docs/benchmarks.md: the InLine layer step
was 60 % idle at 56 x 56), so the InLine layer (Triton backend, the kernels under the interpreter
here) may launch at most 1.15x as many kernels as the SDPA layer (issue 23). Counted as the GPU
would launch them: aten ops that launch a kernel (not views or allocations), plus the Triton
kernels, without the interpreter's own rounding cast of the outputs (bf16 is written as float32
there and rounded by torch, triton#11584; on a GPU the kernels store bf16).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

from inline_attn.layers import build_attention
from inline_attn.ops import use_impl
from inline_attn.ops import tokens as tokens_mod
from inline_attn.ops.fused import triton as triton_core
from op_helpers import LaunchCount

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GOAL = 1.15  # issue 23: InLine layer fwd + bwd at most 1.15x the SDPA layer's launches


def _launches(kind: str, monkeypatch) -> Counter:
    """Launches of a layer's fwd + bwd (B 1, 14 x 14, C 96, 3 heads) under bf16 autocast, by op."""
    monkeypatch.setattr(triton_core, "_out_dtype", lambda q: q.dtype)  # what the launchers do on a GPU
    launch = triton_core._launch

    def launch_unseen(*args, **kwargs):  # the interpreter's own tensor copies are not the kernel's launches
        with _disable_current_modes():
            launch(*args, **kwargs)

    monkeypatch.setattr(triton_core, "_launch", launch_unseen)
    # the mode only records: count the eager step (the layer core's autograd.Function), not the
    # custom op a dispatch mode otherwise gets
    monkeypatch.setattr(tokens_mod, "runs_as_custom_op", lambda: False)
    torch.manual_seed(0)
    layer = build_attention(kind, 96, 3).to(DEVICE)
    x = torch.randn(1, 196, 96, device=DEVICE, requires_grad=True)
    with use_impl("triton"), triton_core.record_launches() as kernels, LaunchCount() as mode:
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            out = layer(x, (14, 14))
        out.float().sum().backward()
    return mode.counts + Counter(f"triton:{k.kernel}" for k in kernels)


def test_inline_layer_launches_within_the_goal_of_sdpa(monkeypatch):
    inline, sdpa = _launches("inline", monkeypatch), _launches("softmax", monkeypatch)
    n_inline, n_sdpa = sum(inline.values()), sum(sdpa.values())
    print(f"InLine {n_inline} launches {dict(inline)}\nSDPA {n_sdpa} launches {dict(sdpa)}")
    # the predictor and the core: one kernel each way, no aten op of the predictor left
    triton = sorted(k.removeprefix("triton:") for k in inline if k.startswith("triton:"))
    assert triton == ["inline_bwd_stream", "inline_fwd_stream", "predictor_bwd", "predictor_fwd"], triton
    assert not {"gelu", "gelu_backward", "baddbmm", "bmm", "mean"} & set(inline), inline
    assert n_inline <= GOAL * n_sdpa, (n_inline, n_sdpa, n_inline / n_sdpa)


def test_planned_launches_stay_out_of_the_callers_logs():
    # the dispatch's fit check plans a layer step on a simulated device in the middle of a real
    # call (on a GPU, the first call of a head shape): those launches never run, and a log opened
    # by the caller must not count them (seen on an H200: 16 planned launches in a test's log)
    from types import SimpleNamespace

    kernel = SimpleNamespace(fn=SimpleNamespace(__name__="planned"))
    limits = triton_core.DeviceLimits("a simulated GPU", 1, 1_000)
    with triton_core.record_launches() as outer:
        with triton_core.simulated_device(limits, lambda *args: 0):
            with triton_core.record_launches() as inner:
                triton_core._launch(kernel, (1,), torch.empty(1, device="meta"))
        assert outer == []
    assert [x.kernel for x in inner] == ["planned"]
    assert triton_core._launch_logs == []
