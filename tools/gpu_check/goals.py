"""The goal table: each goal with the value measured, met or missed (or reported beside a goal),
the device and the command that measures it again.

A goal names the step and part that measure it (:class:`Goal`); the values are in
``results[step]["values"][key]``. A goal whose part did not run says why instead of a value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .tables import markdown


@dataclass(frozen=True)
class Goal:
    """``what`` is met when the value is at least ``target`` (at most, with ``at_most``), in
    ``unit`` ("x": a ratio, "%", "ms"); ``step`` and ``part`` measure it. A ``reported`` row is
    measured beside a goal (an eager row beside its graphed goal) and has no verdict of its own."""

    key: str
    what: str
    target: float
    unit: str
    step: str
    part: str
    at_most: bool = False
    reported: bool = False


# the Triton core's share of the copy rate: key of gpu_check.core.CORE_SHAPES -> (what, goal in %)
CORE_GOALS = {
    "deit": ("InLine-DeiT-T's layer (197 tokens, B 128)", 60.0),
    "14": ("14x14 B 256", 60.0),
    "7": ("7x7 B 1024", 50.0),
    "56": ("56x56 B 64", 70.0),
    "112": ("112x112 B 16", 70.0),
}
_CORES = tuple(CORE_GOALS.items())
_SWIN = "swin-graphed"
# model rows: a training step (forward, cross-entropy, backward), bf16, InLine against the project's
# softmax twin in the same process, interleaved (goals_step); graphed rows are the goals, eager rows
# are reported beside them
GOALS = (
    Goal("deit_graphed", "InLine-DeiT-T / DeiT-T, CUDA-graphed, 224 px, B 128", 1.03, "x", "goals", "deit"),
    Goal("deit_eager", "InLine-DeiT-T / DeiT-T, eager, 224 px, B 128", 1.03, "x", "goals", "deit", reported=True),
    Goal("deit1024", "InLine-DeiT-T / DeiT-T at 1024 px, B 64", 1.75, "x", "goals", "deit1024"),
    Goal("swin_published", "InLine-Swin-T (window 56) / Swin-T (window 7), graphed, B 64", 1.3, "x", "goals", _SWIN),
    Goal("swin_w7", "InLine-Swin-T / Swin-T, both at window 7, CUDA-graphed, B 64", 1.03, "x", "goals", _SWIN),
    Goal("swin_w56", "InLine-Swin-T / Swin-T, both at window 56, CUDA-graphed, B 64", 6.0, "x", "goals", _SWIN),
    Goal("swin_published_eager", "InLine-Swin-T (window 56) / Swin-T (window 7), eager, B 64", 1.3, "x", "goals",
         "swin", reported=True),
    Goal("swin_w7_eager", "InLine-Swin-T / Swin-T, both at window 7, eager, B 64", 1.03, "x", "goals", "swin",
         reported=True),
    Goal("swin_w56_eager", "InLine-Swin-T / Swin-T, both at window 56, eager, B 64", 6.0, "x", "goals", "swin",
         reported=True),
    Goal("layer14_graphed", "layer fwd+bwd / SDPA layer, 14x14 B 1024, CUDA-graphed", 2.0, "x", "goals", "layer"),
    Goal("layer56_graphed", "layer fwd+bwd / SDPA layer, 56x56 B 64, CUDA-graphed", 5.0, "x", "goals", "layer"),
    Goal("layer14_eager", "layer fwd+bwd / SDPA layer, 14x14 B 1024, eager", 2.0, "x", "goals", "layer", reported=True),
    Goal("layer56_eager", "layer fwd+bwd / SDPA layer, 56x56 B 64, eager", 5.0, "x", "goals", "layer", reported=True),
    Goal("layer14_stream", "the same with the streaming kernels, 14x14 B 1024, graphed", 2.0, "x",
         "goals", "layer", reported=True),
    Goal("layer56_stream", "the same with the streaming kernels, 56x56 B 64, graphed", 5.0, "x",
         "goals", "layer", reported=True),
    *(Goal(f"core{k}", f"Triton core fwd+bwd / copy rate, {w}", g, " %", "goals", "core") for k, (w, g) in _CORES),
    Goal("inline_kernels_ms", "InLine kernels' GPU ms, InLine-DeiT-T, B 128", 0.5, " ms", "profile", "inline-deit-t",
         True),
    Goal("cswin_busy_pct", "InLine-CSwin-T: GPU-busy share of a step, the trainer's default GPU path (CUDA-graphed, "
         "fused AdamW), B 128", 90.0, " %", "profile", "inline-cswin-t"),
    Goal("cswin_busy_pct_eager", "InLine-CSwin-T: GPU-busy share of an eager step (fused AdamW), B 128", 90.0, " %",
         "profile", "inline-cswin-t", reported=True),
    Goal("compile_inline", "InLine-DeiT-T, torch.compile / eager CUDA-graphed, B 128", 1.0, "x", "compile",
         "deit-pair"),
    Goal("compile_inline_eager", "InLine-DeiT-T, torch.compile / eager, B 128", 1.0, "x", "compile", "deit-pair",
         reported=True),
    Goal("host_ratio", "host time, layer fwd+bwd, InLine / SDPA, B 1, 4x4, C 96", 1.05, "x", "goals", "host", True),
)  # fmt: skip


COLUMNS = (
    ("what", "goal", ""),
    ("measured", "measured", ""),
    ("target", "target", ""),
    ("verdict", "verdict", ""),
    ("device", "device", ""),
    ("notes", "notes", ""),
    ("command", "command", ""),
)


def verdict(goal: Goal, value: float) -> str:
    """ "met", "missed", "reported" (a row beside a goal), or "-" where nothing was measured."""
    if value is None or not math.isfinite(value):
        return "-"
    if goal.reported:
        return "reported"
    return "met" if (value <= goal.target if goal.at_most else value >= goal.target) else "missed"


def _shown(value: float, unit: str) -> str:
    return f"{value:.2f}x" if unit == "x" else f"{value:.2f}{unit}" if unit == " ms" else f"{value:.0f}{unit}"


def why_missing(goal: Goal, results: dict) -> str:
    """Why a goal has no value: its step or part did not run, failed, or measured nothing."""
    step = results.get(goal.step)
    if step is None:
        return f"not measured: the {goal.step} step did not run"
    if step.get("ok") is None:
        return f"not measured: the {goal.step} step {step.get('summary', 'was skipped')}"
    part = step.get("parts", {}).get(goal.part)
    if part is None:
        return f"not measured: part {goal.part} {step.get('skipped', {}).get(goal.part, 'did not run')}"
    if "error" in part:
        return f"not measured: part {goal.part} failed ({part['error']})"
    return "not measured"


def goal_rows(results: dict, device: str) -> list[dict]:
    """One row per goal of :data:`GOALS`: what, measured, target, verdict, device, notes, command."""
    rows = []
    for goal in GOALS:
        step = results.get(goal.step, {})
        value = step.get("values", {}).get(goal.key)
        measured = value is not None and math.isfinite(value)
        rows.append(
            {
                "what": goal.what,
                "measured": _shown(value, goal.unit) if measured else why_missing(goal, results),
                "target": f"{'(' if goal.reported else ''}{'<=' if goal.at_most else '>='} "
                f"{_shown(goal.target, goal.unit)}{')' if goal.reported else ''}",
                "verdict": verdict(goal, value),
                "device": device,
                "notes": step.get("notes", {}).get(goal.key, ""),
                "command": f'`make gpu-check GPU_CHECK_ARGS="--steps {goal.step} --parts {goal.part}"`',
            }
        )
    return rows


def goal_table(results: dict, device: str) -> str:
    """:func:`goal_rows` as a Markdown table."""
    return markdown(goal_rows(results, device), COLUMNS)
