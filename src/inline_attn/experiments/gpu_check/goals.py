"""Issue 34's goal table: each goal with the value measured, met or missed, the device and the
command that measures it again.

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
    ``unit`` ("x": a ratio, "%", "ms"); ``step`` and ``part`` measure it."""

    key: str
    what: str
    target: float
    unit: str
    step: str
    part: str
    at_most: bool = False


CORE_SIDES = (7, 14, 56, 112)
# model rows: a training step (forward, cross-entropy, backward), bf16, InLine against the project's
# softmax twin in the same process, interleaved (goals_step)
GOALS = (
    Goal("deit_eager", "InLine-DeiT-T / DeiT-T, eager, 224 px, B 128", 1.05, "x", "goals", "deit"),
    Goal("deit_graphed", "InLine-DeiT-T / DeiT-T, CUDA-graphed, 224 px, B 128", 1.1, "x", "goals", "deit"),
    Goal("swin_published", "InLine-Swin-T (window 56) / Swin-T (window 7), B 64", 1.4, "x", "goals", "swin"),
    Goal("swin_w7", "InLine-Swin-T / Swin-T, both at window 7, B 64", 1.15, "x", "goals", "swin"),
    Goal("swin_w56", "InLine-Swin-T / Swin-T, both at window 56, B 64", 4.0, "x", "goals", "swin"),
    Goal("layer56_eager", "layer fwd+bwd / SDPA layer, 56x56 B 64, eager", 3.0, "x", "goals", "layer"),
    Goal("layer56_graphed", "layer fwd+bwd / SDPA layer, 56x56 B 64, CUDA-graphed", 4.0, "x", "goals", "layer"),
    Goal("layer14_graphed", "layer fwd+bwd / SDPA layer, 14x14 B 1024, CUDA-graphed", 1.5, "x", "goals", "layer"),
    *(Goal(f"core{s}", f"Triton core fwd+bwd / copy rate, {s}x{s}", 40.0, " %", "goals", "core") for s in CORE_SIDES),
    Goal("deit1024", "InLine-DeiT-T / DeiT-T at 1024 px, B 64", 2.5, "x", "goals", "deit1024"),
    Goal("host_ratio", "host time, layer fwd+bwd, InLine / SDPA, B 1, 4x4, C 96", 1.25, "x", "goals", "host", True),
    Goal("inline_kernels_ms", "InLine kernels' GPU ms, InLine-DeiT-T", 1.2, " ms", "profile", "inline-deit-t", True),
    Goal("cswin_busy_pct", "InLine-CSwin-T: GPU-busy share of a step", 80.0, " %", "profile", "inline-cswin-t"),
    Goal("compile_inline", "InLine-DeiT-T, torch.compile / eager, B 128", 1.0, "x", "compile", "deit-pair"),
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
    """ "met", "missed", or "-" where nothing was measured."""
    if value is None or not math.isfinite(value):
        return "-"
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
                "target": f"{'<=' if goal.at_most else '>='} {_shown(goal.target, goal.unit)}",
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
