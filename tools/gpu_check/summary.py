"""``summary.md``: the goal table first, then each step's line, the top kernels per model, the
device record and each step's measurement tables."""

from __future__ import annotations

import time

from .goals import goal_table
from .tables import markdown

GOALS_NOTE = (
    "Model rows: a training step (forward, cross-entropy, backward; no optimizer) under bf16 autocast, InLine "
    "against the project's softmax twin built in the same process and timed interleaved; the notes name the "
    "SDPA backend that ran. The profile's rows: a whole step as the trainer builds it (with its fused AdamW), eager "
    "under the profiler and CUDA-graphed as the trainer graphs it by default; a graphed step's GPU-busy share is the "
    "eager profile's GPU-busy ms over the graphed step's ms (a replay runs the same kernels)."
)
ENV_KEYS = ("device", "sms", "memory_gib", "driver", "cuda", "torch", "triton", "python", "copy_GBps", "triton_cache")
STEP_COLUMNS = (
    ("step", "step", ""),
    ("result", "result", ""),
    ("seconds", "seconds", ".0f"),
    ("summary", "summary", ""),
)
MODEL_COLUMNS = (
    ("model", "model", ""),
    ("step_ms", "step ms", ".1f"),
    ("gpu_busy_ms", "GPU busy ms", ".1f"),
    ("busy_pct", "GPU busy %", ".0f"),
    ("kernels", "kernels a step", ".0f"),
    ("inline_ms", "InLine kernels ms", ".2f"),
    ("graphed_step_ms", "graphed step ms", ".1f"),
    ("graphed_busy_pct", "graphed GPU busy %", ".0f"),
)
KERNEL_COLUMNS = (("name", "kernel", ""), ("ms", "ms a step", ".3f"), ("calls", "calls a step", ".1f"))


def step_mark(result: dict) -> str:
    """pass / FAIL / skipped, or "partial" for a step still running when the results were written."""
    if result.get("partial"):
        return "partial"
    return {True: "pass", False: "FAIL", None: "skipped"}[result.get("ok")]


def render_summary(env: dict, results: dict, argv: list[str]) -> str:
    """The whole ``summary.md`` for the steps so far."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    device = env.get("device", "unknown device")
    lines = ["# GPU check", "", f"`{' '.join(['make gpu-check', *argv])}` on {when}, on {device}", ""]
    lines += ["## Goals", "", GOALS_NOTE, "", goal_table(results, device), ""]
    steps = [
        {"step": name, "result": step_mark(r), "seconds": r.get("seconds", 0.0), "summary": r.get("summary", "")}
        for name, r in results.items()
    ]
    lines += ["## Steps", "", markdown(steps, STEP_COLUMNS), ""]
    lines += _profile_section(results.get("profile", {}))
    env_rows = [{"key": k, "value": str(env.get(k))} for k in ENV_KEYS]
    lines += ["## Device", "", markdown(env_rows, (("key", "", ""), ("value", "", ""))), ""]
    for name, r in results.items():
        if r.get("table"):
            lines += [f"## {name}", "", "```", r["table"], "```", ""]
    return "\n".join(lines)


def _profile_section(profile: dict) -> list[str]:
    """One row per profiled model (eager and graphed), why a model was not graphed, then each
    model's top kernels."""
    models = [r for r in profile.get("parts", {}).values() if "model" in r]
    if not models:
        return []
    lines = ["## Profile: one training step per model", "", markdown(models, MODEL_COLUMNS), ""]
    lines += [f"{r['model']}: not graphed: {r['why_not_graphed']}" for r in models if r.get("why_not_graphed")]
    lines += [""] if any(r.get("why_not_graphed") for r in models) else []
    for r in models:
        lines += [f"Top kernels of {r['model']}:", "", markdown(r.get("top", []), KERNEL_COLUMNS), ""]
    return lines
