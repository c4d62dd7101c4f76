"""Optimizers and learning-rate schedules for every task.

One optimizer vocabulary (:data:`OPTIMIZERS`): ``adamw`` (the paper's recipes, classification
and dense alike) and ``sgd`` (momentum 0.9, Nesterov), each with the no-decay parameter groups.
Schedules: timm 0.4.12's cosine with warm-up and cool-down (classification, per optimizer step)
and mmcv's poly with linear warm-up (segmentation and detection, per iteration).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn


def param_groups(model: nn.Module, weight_decay: float, no_weight_decay=None) -> list[dict]:
    """Two groups: decay, and no decay for 1-d params (norms, biases), names ending in ``.bias``
    and the exempt names, matched exactly or by their last component: ``no_weight_decay`` when
    given (a recipe's ``optim.no_weight_decay``), else the model's ``no_weight_decay()`` (position
    embeddings, cls token, relative position tables)."""
    if no_weight_decay is not None:
        skip = set(no_weight_decay)
    else:
        skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim <= 1 or name.endswith(".bias") or name in skip or name.split(".")[-1] in skip:
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


def no_decay_names(model: nn.Module, no_weight_decay=None) -> list[str]:
    """Names of the parameters :func:`param_groups` exempts from weight decay (for tests/logs)."""
    ids = {id(p) for p in param_groups(model, 0.0, no_weight_decay)[0]["params"]}
    return [n for n, p in model.named_parameters() if id(p) in ids]


OPTIMIZERS = ("adamw", "sgd")
SGD_MOMENTUM = 0.9


def build_optimizer(
    model: nn.Module,
    opt: str,
    lr: float,
    weight_decay: float,
    betas=(0.9, 0.999),
    eps: float = 1e-8,
    no_weight_decay=None,
) -> torch.optim.Optimizer:
    """``opt`` (one of :data:`OPTIMIZERS`) over :func:`param_groups`: ``adamw`` with ``betas`` and
    ``eps``, or ``sgd`` with momentum 0.9 and Nesterov."""
    groups = param_groups(model, weight_decay, no_weight_decay)
    if opt == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps)
    if opt == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=SGD_MOMENTUM, nesterov=True)
    raise ValueError(f"optim.opt={opt!r}: expected one of {', '.join(OPTIMIZERS)}")


class CosineSchedule:
    """Per-step learning rate as timm 0.4.12's ``CosineLRScheduler`` with ``t_in_epochs=False``,
    ``cycle_limit=1`` and ``warmup_prefix=False`` (the authors' ``lr_scheduler.py``), stepped as
    their ``main.py`` steps it.

    With ``T = int(epochs * steps_per_epoch)`` and ``T_w = int(warmup_epochs * steps_per_epoch)``,
    timm's value after update ``t`` is ``warmup_lr + t (lr - warmup_lr) / T_w`` for ``t < T_w``,
    ``min_lr + (lr - min_lr) (1 + cos(pi t / T)) / 2`` for ``T_w <= t < T`` (the cosine runs on the
    absolute step: the warm-up only overrides its start), and ``min_lr`` from ``T`` on (the
    ``cooldown_epochs`` after ``epochs``). The authors call it after each optimizer step, so step
    ``k`` (counting from 0) trains with timm's value for ``t = max(k - 1, 0)``: :meth:`lr_at`.

    The lr is a function of the optimizer step only, so the state is just the step count.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        lr: float,
        steps_per_epoch: int,
        epochs: int,
        warmup_epochs: float = 0,
        cooldown_epochs: float = 0,
        warmup_lr: float = 1e-6,
        min_lr: float = 1e-5,
    ):
        if epochs <= 0 or steps_per_epoch <= 0:
            raise ValueError(f"epochs={epochs} and steps_per_epoch={steps_per_epoch} must be positive")
        if warmup_epochs < 0 or warmup_epochs > epochs:
            raise ValueError(f"warmup_epochs={warmup_epochs} must be in [0, epochs={epochs}]")
        self.optimizer = optimizer
        self.lr = lr
        self.warmup_lr = warmup_lr
        self.min_lr = min_lr
        self.warmup_steps = int(warmup_epochs * steps_per_epoch)
        self.cosine_steps = int(epochs * steps_per_epoch)
        self.total_steps = int((epochs + cooldown_epochs) * steps_per_epoch)
        self.step_count = 0
        self._apply()

    def timm_value(self, t: int) -> float:
        """timm's lr after update ``t``."""
        if t < self.warmup_steps:
            return self.warmup_lr + t * (self.lr - self.warmup_lr) / self.warmup_steps
        if t >= self.cosine_steps:
            return self.min_lr
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * t / self.cosine_steps))

    def lr_at(self, step: int) -> float:
        """The lr optimizer step ``step`` (from 0) trains with."""
        return self.timm_value(max(step - 1, 0))

    def _apply(self) -> None:
        lr = self.lr_at(self.step_count)
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def step(self) -> None:
        self.step_count += 1
        self._apply()

    def get_last_lr(self) -> float:
        return self.lr_at(self.step_count)

    def state_dict(self) -> dict:
        return {"step_count": self.step_count}

    def load_state_dict(self, state: dict) -> None:
        self.step_count = int(state["step_count"])
        self._apply()


class PolySchedule:
    """Per-iteration lr (mmcv's ``poly`` policy with linear warm-up, as in the Swin and PVT
    segmentation recipes): ``lr_t = (lr - min_lr) (1 - t / T)^power + min_lr``; during the first
    ``warmup_iters`` it is further multiplied by ``1 - (1 - t / W)(1 - warmup_ratio)``."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        lr: float,
        iters: int,
        power: float = 0.9,
        min_lr: float = 0.0,
        warmup_iters: int = 0,
        warmup_ratio: float = 1e-6,
    ):
        if iters <= 0:
            raise ValueError(f"sched.iters={iters} must be positive")
        if not 0 <= warmup_iters <= iters:
            raise ValueError(f"sched.warmup_iters={warmup_iters} must be in [0, iters={iters}]")
        self.optimizer, self.lr, self.iters, self.power = optimizer, lr, iters, power
        self.min_lr, self.warmup_iters, self.warmup_ratio = min_lr, warmup_iters, warmup_ratio
        self.step_count = 0
        self._apply()

    def lr_at(self, t: int) -> float:
        lr = (self.lr - self.min_lr) * max(0.0, 1 - t / self.iters) ** self.power + self.min_lr
        if t < self.warmup_iters:
            lr *= 1 - (1 - t / self.warmup_iters) * (1 - self.warmup_ratio)
        return lr

    def _apply(self) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = self.lr_at(self.step_count)

    def step(self) -> None:
        self.step_count += 1
        self._apply()

    def state_dict(self) -> dict:
        return {"step_count": self.step_count}

    def load_state_dict(self, state: dict) -> None:
        self.step_count = int(state["step_count"])
        self._apply()
