"""Optimizers and learning-rate schedules for every task.

One optimizer vocabulary (:data:`OPTIMIZERS`): ``adamw`` (the paper's recipes, classification
and dense alike) and ``sgd`` (momentum 0.9, Nesterov), each with the no-decay parameter groups.
Schedules: timm 0.4.12's cosine with warm-up and cool-down (classification, per optimizer step)
and mmcv's poly with linear warm-up (segmentation and detection, per iteration).

A step captured in a CUDA graph (``train.cuda_graphs``) needs an optimizer that updates on the
device: :func:`prepare_for_capture` turns each group's learning rate into a 0-dim tensor on the
parameters' device (the schedules then write it in place, :func:`set_lr`, instead of replacing a
Python float the graph would have baked in), AdamW into ``capturable=True`` (its step counters on
the device) and SGD into its fused kernel (which reads a tensor lr on the device; the others read
it on the host). :func:`plain_state_dict` saves such an optimizer as the plain one would be saved.
"""

from __future__ import annotations

import difflib
import math
import weakref
from typing import Iterable, Optional

import torch
import torch.nn as nn


def param_groups(model: nn.Module, weight_decay: float, no_weight_decay=None, layer_decay=(None, None)) -> list[dict]:
    """Two groups: decay, and no decay for 1-d params (norms, biases), names ending in ``.bias``
    and the exempt names, matched exactly or by their last component: ``no_weight_decay`` when
    given (a recipe's ``optim.no_weight_decay``), else the model's ``no_weight_decay()`` (position
    embeddings, cls token, relative position tables).

    ``layer_decay = (rate, {name: layer})`` with a rate: the two groups per layer, each with
    ``lr_scale = rate ** (L - 1 - layer)`` (timm's layer-wise lr decay; :func:`set_lr` applies it).

    A ``no_weight_decay`` entry that matches no parameter is a ValueError (:func:`check_no_weight_decay`).
    """
    if no_weight_decay is not None:
        check_no_weight_decay(model, no_weight_decay)
        skip = set(no_weight_decay)
    else:
        skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    rate, layers = layer_decay
    groups: dict[tuple[int, bool], list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        exempt = p.ndim <= 1 or name.endswith(".bias") or name in skip or name.split(".")[-1] in skip
        groups.setdefault((0 if rate is None else layers[name], not exempt), []).append(p)
    if rate is None:
        return [{"params": groups.get((0, False), []), "weight_decay": 0.0}] + [
            {"params": groups.get((0, True), []), "weight_decay": weight_decay}
        ]
    top = max(layers.values(), default=0)
    return [
        {"params": ps, "weight_decay": weight_decay if decays else 0.0, "lr_scale": rate ** (top - layer)}
        for (layer, decays), ps in sorted(groups.items())
    ]


def check_no_weight_decay(model: nn.Module, no_weight_decay) -> None:
    """Refuse an entry of ``optim.no_weight_decay`` that matches no parameter of ``model``, exactly
    or by its last name component (a misspelt name would exempt nothing and train with decay on
    it); the ValueError names the entry and the model's names closest to it."""
    names = [n for n, _ in model.named_parameters()]
    leaves = sorted({n.split(".")[-1] for n in names})
    for entry in no_weight_decay:
        if entry in leaves or entry in names:
            continue
        close = difflib.get_close_matches(entry, sorted(set(leaves) | set(names)), n=3)
        hint = (
            f"did you mean {', '.join(close)}?" if close else f"the model's names end in {', '.join(leaves[:8])}, ..."
        )
        raise ValueError(
            f"optim.no_weight_decay={list(no_weight_decay)}: {entry!r} matches no parameter of the model (exactly or "
            f"by its last name component) and would exempt nothing; {hint} ([]: only 1-d parameters and biases)"
        )


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
    layer_decay=(None, None),
) -> torch.optim.Optimizer:
    """``opt`` (one of :data:`OPTIMIZERS`) over :func:`param_groups` (``layer_decay`` as there):
    ``adamw`` with ``betas`` and ``eps``, or ``sgd`` with momentum 0.9 and Nesterov. AdamW over CUDA
    parameters is fused (one kernel for the whole update, its step counters on the device:
    capture-safe); elsewhere the plain implementation, as before."""
    groups = param_groups(model, weight_decay, no_weight_decay, layer_decay)
    for g in groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
    if opt == "adamw":
        cuda = all(p.is_cuda for g in groups for p in g["params"]) and any(g["params"] for g in groups)
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, **({"fused": True} if cuda else {}))
    if opt == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=SGD_MOMENTUM, nesterov=True)
    raise ValueError(f"optim.opt={opt!r}: expected one of {', '.join(OPTIMIZERS)}")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every group's learning rate to ``lr`` times its ``lr_scale`` (layer-wise lr decay; 1 without):
    a Python float is replaced, a tensor lr (an optimizer made ready for capture) is written in
    place, so a captured step reads the new value."""
    for g in optimizer.param_groups:
        value = lr * g.get("lr_scale", 1.0)
        if torch.is_tensor(g["lr"]):
            g["lr"].fill_(value)
        else:
            g["lr"] = value


# optimizer -> each group's settings before prepare_for_capture, for plain_state_dict
_PLAIN_GROUPS: "weakref.WeakKeyDictionary[torch.optim.Optimizer, list[dict]]" = weakref.WeakKeyDictionary()


def prepare_for_capture(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Make ``optimizer`` (AdamW / Adam or SGD) update on the device, in place, so its step can be
    captured in a CUDA graph and its learning rate changed between replays.

    Each group's lr becomes a 0-dim float32 tensor on the parameters' device (:func:`set_lr`
    writes it in place); Adam / AdamW get ``capturable=True`` and their step counters move to
    the device; SGD gets ``fused=True`` (its other paths read a tensor lr on the host, a sync
    that a capture refuses). The update is the same algorithm in float32 device arithmetic (bias
    corrections, lr), so it is close to, not bitwise equal to, the plain optimizer's. Idempotent.
    """
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.SGD)) or any(
        g.get("differentiable") for g in optimizer.param_groups
    ):
        raise ValueError(
            f"prepare_for_capture takes a plain AdamW / Adam or SGD, got {type(optimizer).__name__} "
            "(inline_attn.runtime.graphs.why_not_graphed says why a step cannot be captured)"
        )
    if optimizer not in _PLAIN_GROUPS:
        _PLAIN_GROUPS[optimizer] = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    adam = isinstance(optimizer, torch.optim.Adam)
    for g in optimizer.param_groups:
        if not g["params"]:
            continue
        device = g["params"][0].device
        lr = g["lr"]
        if not (torch.is_tensor(lr) and lr.device == device and lr.dtype == torch.float32 and lr.dim() == 0):
            g["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=device)
        if adam:
            g["capturable"] = True
            for p in g["params"]:
                state = optimizer.state.get(p, {})
                if "step" in state:
                    state["step"] = state["step"].to(dtype=torch.float32, device=p.device)
        else:
            g["fused"], g["foreach"] = True, False
    return optimizer


def plain_state_dict(optimizer: torch.optim.Optimizer) -> dict:
    """``optimizer.state_dict()`` as the optimizer would give it before :func:`prepare_for_capture`
    (float learning rates, its own capturable / fused / foreach settings, step counters on the
    host), so a checkpoint resumes the same with or without CUDA graphs; an optimizer never
    prepared gives its state_dict unchanged."""
    sd = optimizer.state_dict()
    plain = _PLAIN_GROUPS.get(optimizer)
    if plain is None:
        return sd
    groups, host_steps = [], set()
    for group, before in zip(sd["param_groups"], plain):
        group = dict(group)
        for key in ("capturable", "fused", "foreach"):
            if key in before:
                group[key] = before[key]
        if torch.is_tensor(group["lr"]) and not torch.is_tensor(before["lr"]):
            group["lr"] = float(group["lr"])
        if not (before.get("capturable") or before.get("fused")):  # where torch keeps a plain step counter
            host_steps.update(group["params"])
        groups.append(group)
    state = {}
    for i, st in sd["state"].items():
        state[i] = {k: v.cpu() if k == "step" and i in host_steps else v for k, v in st.items()}
    return {"state": state, "param_groups": groups}


class StepSchedule:
    """A learning rate that is a function of the optimizer step alone, written into the
    optimizer's groups (:func:`set_lr`) at construction and after every :meth:`step`.

    Subclasses define :meth:`lr_at`; the state is the step count (``{"step_count": n}`` in
    checkpoints), so resuming re-derives the lr exactly.
    """

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.step_count = 0

    def lr_at(self, step: int) -> float:
        """The lr optimizer step ``step`` (from 0) trains with."""
        raise NotImplementedError

    def _apply(self) -> None:
        set_lr(self.optimizer, self.lr_at(self.step_count))

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


class CosineSchedule(StepSchedule):
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
        super().__init__(optimizer)
        self.lr = lr
        self.warmup_lr = warmup_lr
        self.min_lr = min_lr
        self.warmup_steps = int(warmup_epochs * steps_per_epoch)
        self.cosine_steps = int(epochs * steps_per_epoch)
        self.total_steps = int((epochs + cooldown_epochs) * steps_per_epoch)
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


class PolySchedule(StepSchedule):
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
        super().__init__(optimizer)
        self.lr, self.iters, self.power = lr, iters, power
        self.min_lr, self.warmup_iters, self.warmup_ratio = min_lr, warmup_iters, warmup_ratio
        self._apply()

    def lr_at(self, t: int) -> float:
        lr = (self.lr - self.min_lr) * max(0.0, 1 - t / self.iters) ** self.power + self.min_lr
        if t < self.warmup_iters:
            lr *= 1 - (1 - t / self.warmup_iters) * (1 - self.warmup_ratio)
        return lr


def backward(loss: torch.Tensor, scaler: Optional[torch.amp.GradScaler]) -> None:
    """``loss.backward()``, scaled under fp16."""
    (scaler.scale(loss) if scaler is not None else loss).backward()


def optimizer_step(
    params: Iterable[nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scaler: Optional[torch.amp.GradScaler],
    clip_grad: Optional[float],
) -> None:
    """Apply the accumulated gradients: unscale (fp16), clip their total norm to ``clip_grad``
    (None or 0: off), step the optimizer (the scaler skips a step with non-finite gradients)."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    if clip_grad:
        nn.utils.clip_grad_norm_([p for p in params if p.requires_grad], float(clip_grad))
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
