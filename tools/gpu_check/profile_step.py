"""The ``profile`` step: one whole training step per model as the trainer builds it (forward under
bf16 autocast, cross-entropy, backward and the AdamW of :func:`inline_attn.runtime.optim.build_optimizer`,
fused on CUDA; 224 px, B 128), eager and CUDA-graphed.

The eager step runs under ``torch.profiler``: its time (CUDA events, unprofiled), how much of it
the GPU is busy, the kernels it launches, the InLine kernels' time and the top kernels. Then the
same step is captured as the trainer captures it by default (``train.cuda_graphs``: the optimizer
made ready for capture, :class:`inline_attn.runtime.graphs.GraphedTrainStep`, wherever
:func:`~inline_attn.runtime.graphs.why_not_graphed` gives no reason) and timed the same way. A
replay runs the eager step's kernels with one launch, so the graphed step's GPU-busy share is the
eager profile's GPU-busy ms over the graphed step's ms. A step that cannot be captured has no
graphed values, and its row says why. Each model is a :class:`.budget.Part`; the operator tables
go to ``profile.txt``.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from inline_attn.runtime import optim
from inline_attn.runtime.graphs import GraphedTrainStep, capture, train_step, why_not_graphed

from .budget import Part, StepContext, run_parts
from .kernels import kernel_stats

BATCH, RESOLUTION = 128, 224
TIMED_STEPS, PROFILED_STEPS = 5, 3
DEVICE = "cuda"
# the tiny models' AdamW recipe at the global batch of 1024 (docs/training.md): lr 1e-3, weight decay 0.05
LR, WEIGHT_DECAY = 1e-3, 0.05
# label, registered name, constructor overrides; DeiT-T is the project's softmax twin (bench.model.preset_cases)
MODELS = (
    ("InLine-DeiT-T", "inline_deit_tiny", {}),
    ("DeiT-T", "inline_deit_tiny", {"pattern": "S", "num_heads": 3}),
    ("InLine-Swin-T", "inline_swin_tiny", {}),
    ("InLine-PVT-T", "inline_pvt_tiny", {}),
    ("InLine-CSwin-T", "inline_cswin_tiny", {}),
)
# the goal values a model's profile gives (goals.GOALS): its key -> (the row's key); the CSwin goal
# is the graphed step's share (the trainer's default GPU path), the eager one is reported beside it
GOAL_VALUES = {
    "InLine-DeiT-T": {"inline_kernels_ms": "inline_ms"},
    "InLine-CSwin-T": {"cswin_busy_pct": "graphed_busy_pct", "cswin_busy_pct_eager": "busy_pct"},
}


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The step's loss: cross-entropy of the logits in float32 (they come out of autocast in bf16)."""
    return F.cross_entropy(logits.float(), target)


def trainer_step(model: torch.nn.Module, device: str = DEVICE) -> tuple:
    """The trainer's training step of ``model`` on random images -> (optimizer, images [B, 3, R, R],
    targets [B], step): the optimizer is :func:`~inline_attn.runtime.optim.build_optimizer`'s AdamW
    (fused over CUDA parameters), ``step()`` is :func:`~inline_attn.runtime.graphs.train_step` under
    bf16 autocast (zero the gradients, forward, cross-entropy, backward, AdamW)."""
    opt = optim.build_optimizer(model, "adamw", LR, WEIGHT_DECAY)
    x = torch.randn(BATCH, 3, RESOLUTION, RESOLUTION, device=device)
    target = torch.randint(0, 1000, (BATCH,), device=device)

    def step():
        return train_step(model, opt, cross_entropy, x, target, amp=torch.bfloat16)

    return opt, x, target, step


def timed_ms(step: Callable[[], object], label: str, device: str) -> tuple[float, str]:
    """The median ms of ``step`` (3 warm-up calls, :data:`TIMED_STEPS` timed) -> (ms, "ok") or
    (nan, the failure's status)."""
    from inline_attn.bench.timing import time_interleaved

    timing = time_interleaved({label: step}, warmup=3, repeats=TIMED_STEPS, device=device)[label]
    return timing.median * 1e3, timing.status


def profiled_stats(step: Callable[[], object]) -> tuple[dict, str]:
    """:data:`PROFILED_STEPS` calls of the CUDA ``step`` under ``torch.profiler`` -> (the per-step
    kernel statistics of :func:`.kernels.kernel_stats`, the operator table)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_STEPS):
            step()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=20, max_name_column_width=70)
    return kernel_stats(prof.events(), PROFILED_STEPS), table


def graphed_ms(model, opt, x, target, label: str, capture_fn: Callable = capture) -> tuple[float, Optional[str]]:
    """The step of :func:`trainer_step` captured as the trainer captures it and timed like the
    eager one -> (median ms, None), or (nan, why it could not be captured or replayed). The
    optimizer is made ready for capture (:func:`~inline_attn.runtime.optim.prepare_for_capture`),
    as the trainer does before its first graphed step. ``capture_fn``: as in
    :class:`~inline_attn.runtime.graphs.GraphedTrainStep` (the CPU tests pass an eager stand-in)."""
    why = why_not_graphed(x.device, model=model, optimizer=opt, amp="bf16")
    if why is not None:
        return math.nan, why
    optim.prepare_for_capture(opt)
    graphed = GraphedTrainStep(
        model, opt, cross_entropy, x, target, amp=torch.bfloat16, why_not=None, capture_fn=capture_fn
    )
    if graphed.why_not is not None:
        return math.nan, graphed.why_not
    ms, status = timed_ms(lambda: graphed(x, target), label, x.device.type)
    if status != "ok":
        return math.nan, f"the replays failed: {status}"
    if graphed.ungraphed_steps:  # never an eager time under the graphed label
        return math.nan, f"{graphed.ungraphed_steps} of the timed steps ran ungraphed"
    return ms, None


def model_row(label: str, step_ms: float, stats: dict, step_graphed_ms: float, why_not: Optional[str]) -> dict:
    """One model's row: the eager step's ms, ``stats`` (:func:`.kernels.kernel_stats`) and GPU-busy
    %; the graphed step's ms and GPU-busy % (the eager profile's GPU-busy ms over it), or, where
    the step was not graphed, ``why_not_graphed`` and no graphed fields; ``values``: the goal
    values of :data:`GOAL_VALUES` (nan where not measured, the reason in ``notes``)."""
    busy = stats["gpu_busy_ms"]
    row = {"model": label, "step_ms": step_ms, **stats, "busy_pct": 100 * busy / step_ms}
    if why_not is None:
        row.update(graphed_step_ms=step_graphed_ms, graphed_busy_pct=100 * busy / step_graphed_ms)
    else:
        row["why_not_graphed"] = why_not
    values = {goal: row.get(key, math.nan) for goal, key in GOAL_VALUES.get(label, {}).items()}
    notes = {
        goal: f"not graphed: {why_not}"
        for goal, key in GOAL_VALUES.get(label, {}).items()
        if key.startswith("graphed_") and why_not is not None
    }
    return {**row, "values": values, "notes": notes}


def profile_model(
    ctx: StepContext, label: str, name: str, overrides: dict, device: str = DEVICE, capture_fn: Callable = capture
) -> dict:
    """One model's row (:func:`model_row`): the eager step timed and profiled, then graphed and timed."""
    from inline_attn import create_model

    model = create_model(name, **overrides).to(device).train()
    opt, x, target, step = trainer_step(model, device)
    step_ms, status = timed_ms(step, label, device)
    if status != "ok":
        raise RuntimeError(f"{label}'s eager step failed: {status}")
    stats, table = profiled_stats(step)
    step_graphed_ms, why_not = graphed_ms(model, opt, x, target, label, capture_fn)
    graphed = f"{step_graphed_ms:.2f} ms a step CUDA-graphed" if why_not is None else f"not graphed: {why_not}"
    with open(ctx.out / "profile.txt", "a") as fh:
        fh.write(
            f"\n===== {label}, B {BATCH}: {step_ms:.2f} ms a step eager, GPU busy {stats['gpu_busy_ms']:.2f} ms; "
            f"{graphed}\n{table}\n"
        )
    del model, opt, step
    if device == "cuda":
        torch.cuda.empty_cache()  # the graph's memory pool went with the graphed step
    return model_row(label, step_ms, stats, step_graphed_ms, why_not)


def part_name(label: str) -> str:
    """The ``--parts`` name of a model: its label in lower case ("inline-deit-t")."""
    return label.lower()


# usual seconds: build, 3 warm-up, 5 timed and 3 profiled eager steps took 3-5 s a model on an H200
# (2026-11-26, 2026-11-28), 13-14 s for InLine-CSwin-T. The graphed step adds a capture (3 warm-up
# steps and the captured one, about 4 eager steps of host time) and 9 replays (3 warm-up, 1 sizing,
# 5 timed; each about the eager step's GPU-busy time): an estimate of 0.3-0.6 s a model and 1.1 s
# for InLine-CSwin-T (4 x 137 ms + 9 x 60 ms); 1 s and 2 s with a margin for the graph's build
PARTS = tuple(
    Part(
        part_name(label),
        20 if "CSwin" in label else 7,
        functools.partial(profile_model, label=label, name=name, overrides=ov),
    )
    for label, name, ov in MODELS
)


def busy_line(rows) -> str:
    """Each profiled model's GPU-busy shares: "InLine-CSwin-T 44 % eager, 91 % graphed" (or "not graphed")."""
    return ", ".join(
        f"{r['model']} {r['busy_pct']:.0f} % eager, "
        + (f"{r['graphed_busy_pct']:.0f} % graphed" if "graphed_busy_pct" in r else "not graphed")
        for r in rows
        if "model" in r
    )


def run(ctx: StepContext) -> dict:
    """Every model of :data:`MODELS` that fits the box, in order; ``profile.txt`` starts empty. The
    summary ends with each model's GPU-busy shares (:func:`busy_line`)."""
    (ctx.out / "profile.txt").write_text(
        f"torch.profiler operator tables, one eager training step per model (B {BATCH}, fused AdamW)\n"
    )
    result = run_parts(ctx, PARTS)
    line = busy_line(result["parts"].values())
    if line:
        result["summary"] += f"; GPU busy: {line}"
    return result
