"""The profile breakdown files the InLine layer's Triton kernels under "attention core", as the custom
op: under ``torch.compile`` on CUDA the compiled graph launches them by name (no custom op)."""

from __future__ import annotations

import pytest
from torch.profiler import record_function

from inline_attn.bench.breakdown import ATTENTION_CORE, categorize, inline_kernel_names, profile_breakdown

pytest.importorskip("triton", reason="the kernel names are read from the Triton kernel modules")

# the streaming kernels, a split launch, their flat twins and the predictor
KNOWN = ("inline_fwd_stream", "inline_bwd_stream", "inline_fwd_partial", "inline_bwd_rows", "predictor_fwd")
KNOWN += ("predictor_bwd", "inline_fwd_stream_flat", "inline_bwd_stream_flat", "inline_bwd_rows_flat")


def test_every_inline_kernel_and_its_compiled_launch_is_attention_core():
    names = inline_kernel_names()
    assert set(KNOWN) <= set(names)
    assert not [n for n in names if n.startswith("_")], "a jit helper is not a kernel"
    for name in names:
        assert categorize(name) == ATTENTION_CORE, name
        assert categorize(f"{name}_0") == ATTENTION_CORE, name  # inductor's name for a user kernel's launch
    for op in ("inline_attn::kernels_forward", "inline_attn::kernels_backward", "inline_attn::inline_forward"):
        assert categorize(op) == ATTENTION_CORE
    assert categorize("aten::addmm") == "linear" and categorize("triton_poi_fused_gelu_0") == "activation"


def _busy():
    return sum(i * i for i in range(20_000))  # self time inside a span, no operator


def test_a_kernel_launch_span_counts_and_a_user_annotation_does_not():
    def step():
        with record_function("inline_bwd_stream_flat_0"):  # as inductor records a launch
            _busy()
        with record_function("Optimizer.step#AdamW.step"):
            _busy()

    out = profile_breakdown(step, steps=2)
    assert out[ATTENTION_CORE] > 0
    assert sum(out.values()) == out[ATTENTION_CORE]
