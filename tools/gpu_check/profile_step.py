"""The ``profile`` step: one whole training step per model (forward, cross-entropy, backward and
AdamW, bf16 autocast, 224 px, B 128) under ``torch.profiler``: the step's time (CUDA events,
unprofiled), how much of it the GPU is busy, the kernels a step launches, the InLine kernels'
time and the top kernels. Each model is a :class:`.budget.Part`; the operator tables go to
``profile.txt``.
"""

from __future__ import annotations

import functools

import torch

from .budget import Part, StepContext, run_parts
from .kernels import kernel_stats

BATCH, RESOLUTION = 128, 224
TIMED_STEPS, PROFILED_STEPS = 5, 3
# label, registered name, constructor overrides; DeiT-T is the project's softmax twin (bench.model.preset_cases)
MODELS = (
    ("InLine-DeiT-T", "inline_deit_tiny", {}),
    ("DeiT-T", "inline_deit_tiny", {"pattern": "S", "num_heads": 3}),
    ("InLine-Swin-T", "inline_swin_tiny", {}),
    ("InLine-PVT-T", "inline_pvt_tiny", {}),
    ("InLine-CSwin-T", "inline_cswin_tiny", {}),
)
# the goal values a model's profile gives (goals.GOALS): its key -> (the stats' key)
GOAL_VALUES = {"InLine-DeiT-T": {"inline_kernels_ms": "inline_ms"}, "InLine-CSwin-T": {"cswin_busy_pct": "busy_pct"}}


def train_step(model: torch.nn.Module, batch: int):
    """One training step of ``model`` on random images: zero the gradients, forward under bf16
    autocast, cross-entropy, backward, AdamW."""
    import torch.nn.functional as F

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    x = torch.randn(batch, 3, RESOLUTION, RESOLUTION, device="cuda")
    target = torch.randint(0, 1000, (batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float(), target)
        loss.backward()
        opt.step()

    return step


def profile_model(ctx: StepContext, label: str, name: str, overrides: dict) -> dict:
    """One model's row: step ms, GPU-busy ms and %, kernels a step, InLine kernels' ms, top kernels."""
    from torch.profiler import ProfilerActivity, profile

    from inline_attn import create_model
    from inline_attn.bench.timing import time_interleaved

    model = create_model(name, **overrides).cuda().train()
    step = train_step(model, BATCH)
    step_ms = time_interleaved({label: step}, warmup=3, repeats=TIMED_STEPS, device="cuda")[label].median * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_STEPS):
            step()
        torch.cuda.synchronize()
    stats = kernel_stats(prof.events(), PROFILED_STEPS)
    table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=20, max_name_column_width=70)
    with open(ctx.out / "profile.txt", "a") as fh:
        fh.write(
            f"\n===== {label}, B {BATCH}: {step_ms:.2f} ms a step, GPU busy {stats['gpu_busy_ms']:.2f} ms\n{table}\n"
        )
    del model, step, prof
    torch.cuda.empty_cache()
    row = {"model": label, "step_ms": step_ms, **stats, "busy_pct": 100 * stats["gpu_busy_ms"] / step_ms}
    values = {goal: row[stat] for goal, stat in GOAL_VALUES.get(label, {}).items()}
    return {**row, "values": values}


def part_name(label: str) -> str:
    """The ``--parts`` name of a model: its label in lower case ("inline-deit-t")."""
    return label.lower()


# usual seconds (build, 3 warm-up, 5 timed and 3 profiled steps): 3-5 s a model on an H200
# (2026-11-26, 2026-11-28), 13-14 s for InLine-CSwin-T; with a margin
PARTS = tuple(
    Part(
        part_name(label),
        18 if "CSwin" in label else 6,
        functools.partial(profile_model, label=label, name=name, overrides=ov),
    )
    for label, name, ov in MODELS
)


def run(ctx: StepContext) -> dict:
    """Every model of :data:`MODELS` that fits the box, in order; ``profile.txt`` starts empty."""
    (ctx.out / "profile.txt").write_text(f"torch.profiler operator tables, one training step per model (B {BATCH})\n")
    return run_parts(ctx, PARTS)
