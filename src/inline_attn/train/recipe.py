"""What a config means on a given number of processes: total batch, accumulation, learning rates, EMA decay.

The authors (LeapLabTHU/InLine ``main.py:81-83``, ``main_ema.py:101``) scale three learning rates by
the total batch and the EMA decay by the averaging horizon:

    total_batch = batch_size x processes x accum_steps
    lr, warmup_lr, min_lr = base_lr, sched.warmup_lr, sched.min_lr  x  total_batch / 512
    ema_decay = train.ema_decay ** (total_batch / train.ema_batch)   (0.9996 ** (total / 4096))

``optim.total_batch`` pins the total batch (the recipes pin the authors': 8 GPUs x their per-GPU
batch), so a run on fewer processes or with smaller micro-batches accumulates gradients to reach
it: ``accum_steps = total_batch / (batch_size x processes)``, refused with the numbers when that is
not a whole number. ``optim.lr`` pins an absolute learning rate instead of scaling (warmup_lr and
min_lr are then taken as absolute too).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from .config import LR_REFERENCE_BATCH, Config


@dataclass(frozen=True)
class Recipe:
    """The resolved numbers a run trains with."""

    world_size: int
    batch_size: int  # per process and micro-batch
    accum_steps: int
    total_batch: int
    lr: float
    warmup_lr: float
    min_lr: float
    lr_scale: Optional[float]  # total_batch / 512; None when optim.lr pins the lr
    ema_decay: Optional[float]  # None without EMA

    def describe(self) -> str:
        """One line for the run's log."""
        scale = (
            f" (base values x {self.total_batch}/{LR_REFERENCE_BATCH})"
            if self.lr_scale is not None
            else " (optim.lr: absolute)"
        )
        s = (
            f"total batch {self.total_batch} = {self.batch_size} per process x {self.world_size} process"
            f"{'es' if self.world_size != 1 else ''} x {self.accum_steps} accumulation step"
            f"{'s' if self.accum_steps != 1 else ''}; lr {self.lr:.4g}, warmup_lr {self.warmup_lr:.4g}, "
            f"min_lr {self.min_lr:.4g}{scale}"
        )
        if self.ema_decay is not None:
            s += f"; EMA decay {self.ema_decay:.6f}"
        return s

    def to_dict(self) -> dict:
        return asdict(self)


def _divisors_near(n: int, target: int, count: int = 3) -> list[int]:
    divs = [d for d in range(1, n + 1) if n % d == 0]
    return sorted(sorted(divs, key=lambda d: (abs(d - target), -d))[:count])


def accumulation(total_batch: int, batch_size: int, world_size: int, accum_steps: int = 1) -> int:
    """The accumulation steps that reach ``total_batch`` with ``batch_size`` images on each of
    ``world_size`` processes (ValueError with the numbers when none does, or when an explicit
    ``accum_steps`` other than 1 disagrees)."""
    per_step = batch_size * world_size
    where = (
        f"optim.total_batch={total_batch} with data.batch_size={batch_size} x {world_size} "
        f"process{'es' if world_size != 1 else ''} ({per_step} images per micro-step)"
    )
    if total_batch % per_step:
        hint = ""
        if total_batch % world_size == 0:
            sizes = _divisors_near(total_batch // world_size, batch_size)
            hint = f"; a data.batch_size that divides {total_batch // world_size} reaches it, e.g. {sizes}"
        else:
            hint = f"; {total_batch} images cannot be split evenly over {world_size} processes"
        raise ValueError(
            f"cannot reach {where}: {total_batch} / {per_step} = {total_batch / per_step:.4g} "
            f"is not a whole number of accumulation steps{hint}"
        )
    steps = total_batch // per_step
    if accum_steps not in (1, steps):
        raise ValueError(
            f"optim.accum_steps={accum_steps} disagrees with {where}, which needs {steps} "
            "accumulation steps: set only one of the two"
        )
    return steps


def resolve(cfg: Config, world_size: int) -> Recipe:
    """The :class:`Recipe` of ``cfg`` on ``world_size`` processes."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: expected at least 1 process")
    o, s, t = cfg.optim, cfg.sched, cfg.train
    bs = cfg.data.batch_size
    if o.total_batch is not None:
        accum = accumulation(o.total_batch, bs, world_size, o.accum_steps)
    else:
        accum = o.accum_steps
    total = bs * world_size * accum
    if o.lr is not None:
        lr, warmup_lr, min_lr, scale = o.lr, s.warmup_lr, s.min_lr, None
    else:
        scale = total / LR_REFERENCE_BATCH
        lr, warmup_lr, min_lr = o.base_lr * scale, s.warmup_lr * scale, s.min_lr * scale
    ema = None
    if t.ema:
        ema = t.ema_decay ** (total / t.ema_batch) if t.ema_batch else t.ema_decay
    return Recipe(
        world_size=world_size,
        batch_size=bs,
        accum_steps=accum,
        total_batch=total,
        lr=lr,
        warmup_lr=warmup_lr,
        min_lr=min_lr,
        lr_scale=scale,
        ema_decay=ema,
    )
