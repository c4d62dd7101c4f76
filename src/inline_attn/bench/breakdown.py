"""Where a step's time goes: ``torch.profiler`` self time grouped into a few categories.

Used by ``inline-attn bench model --breakdown``: after the timed rounds, three more steps of each
case run under the profiler and its operators' self CPU time is summed per category. The
attention core is what InLine replaces (its custom op; under ``torch.compile`` on CUDA the
``inline_attn::kernels_*`` ops and the InLine Triton kernels that inductor launches by name); the
rest (projections, MLP, norms, layout copies) is shared by the softmax and InLine models, so
``softmax model time / InLine time without its attention core`` bounds the speedup any attention
core could give (Amdahl's law).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Callable

from torch.profiler import ProfilerActivity, profile

__all__ = ["BREAKDOWN_CATEGORIES", "categorize", "inline_kernel_names", "profile_breakdown"]

ATTENTION_CORE = "attention core"
# the modules whose public jit functions are the InLine layer's Triton kernels: the core's (and the
# flat twins that torch.compile launches) and the predictor's
_KERNEL_MODULES = (
    "inline_attn.ops.fused.triton_kernels",
    "inline_attn.ops.fused.triton_stream",
    "inline_attn.ops.fused.triton_flat",
)

# (category, substrings of operator names), first match wins
_RULES = (
    (ATTENTION_CORE, ("inline_attn::", "scaled_dot_product", "_softmax", "aten::bmm", "aten::baddbmm")),
    ("linear", ("aten::addmm", "aten::mm", "aten::linear", "aten::matmul")),
    ("copies", ("aten::copy_", "aten::cat", "aten::index", "aten::roll", "aten::clone", "aten::contiguous")),
    ("activation", ("gelu",)),
    ("normalization", ("layer_norm",)),
    ("convolution", ("convolution",)),
)
BREAKDOWN_CATEGORIES = tuple(c for c, _ in _RULES) + ("other",)


@functools.cache
def inline_kernel_names() -> tuple[str, ...]:
    """The names of the InLine layer's Triton kernels (``inline_fwd_stream``, ``predictor_bwd``, ...):
    the public jit functions of the kernel modules, read on first use (importing triton then, not
    when this module is imported); empty where triton is not installed."""
    if importlib.util.find_spec("triton") is None:
        return ()
    from triton.runtime.jit import KernelInterface

    names = set()
    for module in _KERNEL_MODULES:
        found = vars(importlib.import_module(module)).items()
        names |= {name for name, f in found if isinstance(f, KernelInterface) and not name.startswith("_")}
    return tuple(sorted(names))


def _is_inline_kernel(name: str) -> bool:
    # substrings: inductor names a user-defined kernel's launch after the kernel, with a suffix ("_0")
    return any(k in name for k in inline_kernel_names())


def categorize(op_name: str) -> str:
    """An operator or kernel name ("aten::addmm", "inline_attn::inline_forward", a launch of
    ``inline_bwd_stream_flat``) -> its category."""
    if _is_inline_kernel(op_name):
        return ATTENTION_CORE
    for category, keys in _RULES:
        if any(k in op_name for k in keys):
            return category
    return "other"


def profile_breakdown(step: Callable[[], object], steps: int = 3) -> dict[str, float]:
    """Run ``step`` ``steps`` times under the profiler; mean milliseconds of self CPU time per
    category and step.

    Operators (names with ``::``) and the InLine Triton kernels' launches are counted; user
    annotations (``ProfilerStep``, the optimizer's step span) are not: their self time is the host
    time between the operators inside them. On CPU the categories add up to the step's time on the
    calling thread (the profiler records each operator once, where it was called), close to its
    wall time.
    """
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    out = dict.fromkeys(BREAKDOWN_CATEGORIES, 0.0)
    for evt in prof.key_averages():
        if evt.self_cpu_time_total > 0 and ("::" in evt.key or _is_inline_kernel(evt.key)):
            out[categorize(evt.key)] += evt.self_cpu_time_total / 1e3 / steps
    return out
