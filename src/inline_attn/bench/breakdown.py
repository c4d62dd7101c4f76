"""Where a step's time goes: ``torch.profiler`` self time grouped into a few categories.

Used by ``inline-attn bench model --breakdown``: after the timed rounds, three more steps of each
case run under the profiler and its operators' self CPU time is summed per category. The
attention core is what InLine replaces; the rest (projections, MLP, norms, layout copies) is
shared by the softmax and InLine models, so ``softmax model time / InLine time without its
attention core`` bounds the speedup any attention core could give (Amdahl's law).
"""

from __future__ import annotations

from typing import Callable

from torch.profiler import ProfilerActivity, profile

__all__ = ["BREAKDOWN_CATEGORIES", "categorize", "profile_breakdown"]

# (category, substrings of operator names), first match wins
_RULES = (
    ("attention core", ("inline_attn::", "scaled_dot_product", "_softmax", "aten::bmm", "aten::baddbmm")),
    ("linear", ("aten::addmm", "aten::mm", "aten::linear", "aten::matmul")),
    ("copies", ("aten::copy_", "aten::cat", "aten::index", "aten::roll", "aten::clone", "aten::contiguous")),
    ("activation", ("gelu",)),
    ("normalization", ("layer_norm",)),
    ("convolution", ("convolution",)),
)
BREAKDOWN_CATEGORIES = tuple(c for c, _ in _RULES) + ("other",)


def categorize(op_name: str) -> str:
    """An operator name ("aten::addmm", "inline_attn::inline_forward") -> its category."""
    for category, keys in _RULES:
        if any(k in op_name for k in keys):
            return category
    return "other"


def profile_breakdown(step: Callable[[], object], steps: int = 3) -> dict[str, float]:
    """Run ``step`` ``steps`` times under the profiler; mean milliseconds of self CPU time per
    category and step.

    On CPU the categories add up to the step's time on the calling thread (the profiler records
    each operator once, where it was called), close to its wall time.
    """
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    out = dict.fromkeys(BREAKDOWN_CATEGORIES, 0.0)
    for evt in prof.key_averages():
        if evt.self_cpu_time_total > 0 and "::" in evt.key:
            out[categorize(evt.key)] += evt.self_cpu_time_total / 1e3 / steps
    return out
