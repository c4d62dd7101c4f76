"""Classification checkpoints: what a training run saves and the checks before it continues one.

Writing, rotation and finding the checkpoint to resume from are :mod:`inline_attn.runtime.checkpoint`'s
(shared by every task). Resuming checks the checkpoint
against the run continuing it: the config (only the settings declared ``resume=True`` may
differ), the number of processes and the steps per epoch, then the weights and optimizer
state, each mismatch a ValueError naming the file and what differs.
"""

from __future__ import annotations

import time
from typing import Optional

from ..models.checkpoint import read_checkpoint
from ..runtime.checkpoint import PathLike, check_resume, load_module, load_optimizer
from ..runtime.checkpoint import load_resume as _load_resume
from ..runtime.optim import plain_state_dict
from .config import Config
from .state import TrainState

__all__ = [
    "BEST",
    "BEST_EMA",
    "load",
    "load_resume",
    "restore",
    "state_dict",
]

BEST = "best.pth"  # the epoch with the best top-1 so far (the authors' max_acc.pth)
BEST_EMA = "best_ema.pth"  # the epoch with the best EMA top-1 (max_ema_acc.pth)
REQUIRED_KEYS = ("model", "optimizer", "scheduler", "epoch", "step_in_epoch", "step")


def load(path: PathLike) -> dict:
    """A training checkpoint of this package (ValueError naming the file when it is not one)."""
    # our checkpoints hold config dicts, RNG states and numpy arrays: not weights_only-safe
    ckpt = read_checkpoint(path, weights_only=False)
    missing = [k for k in REQUIRED_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise ValueError(
            f"checkpoint {str(path)!r} is not a training checkpoint (no {', '.join(missing)}); "
            "to start from its weights use --model.checkpoint instead of --resume"
        )
    return ckpt


def load_resume(resume: Optional[str], output: PathLike):
    """``(path, checkpoint)`` to resume from, or None to start afresh
    (:func:`inline_attn.runtime.checkpoint.load_resume` with :func:`load`)."""
    return _load_resume(resume, output, load)


def state_dict(
    state: TrainState,
    cfg: Config,
    *,
    rank_states: list,
    world_size: int,
    steps_per_epoch: int,
    extra: dict,
    t_start: float,
) -> dict:
    """Everything a resume needs, plus what evaluation needs to rebuild the model (``extra``)."""
    return {
        "model": state.model.state_dict(),
        "optimizer": plain_state_dict(state.optimizer),  # as saved without CUDA graphs: resumable either way
        "scheduler": state.sched.state_dict(),
        "scaler": state.scaler.state_dict() if state.scaler is not None else None,
        "model_ema": state.ema.module.state_dict() if state.ema is not None else None,
        "epoch": state.epoch,
        "step_in_epoch": state.step_in_epoch,
        "step": state.step,
        "history": state.history,
        "rank_states": rank_states,
        "config": cfg.to_dict(),
        "elapsed_s": state.elapsed_s + (time.time() - t_start),
        "world_size": world_size,
        "steps_per_epoch": steps_per_epoch,
        **extra,
    }


def restore(
    state: TrainState, ckpt: dict, path: PathLike, cfg: Config, *, world_size: int, steps_per_epoch: int
) -> Optional[dict]:
    """Load ``ckpt`` into ``state`` after checking it belongs to this run; returns this rank's
    saved ``{"rng", "partial"}`` (None when it was saved by another number of processes)."""
    where = f"checkpoint {str(path)!r}"
    check_resume(where, cfg.differences(ckpt.get("config") or {}), ckpt.get("world_size"), world_size)
    saved_steps = ckpt.get("steps_per_epoch")
    if saved_steps is not None and int(saved_steps) != steps_per_epoch:
        raise ValueError(
            f"cannot resume from {where}: an epoch had {saved_steps} steps, now {steps_per_epoch} "
            "(the training data changed)"
        )
    load_module(state.model, ckpt["model"], where, "model")
    if state.ema is not None and ckpt.get("model_ema"):
        load_module(state.ema.module, ckpt["model_ema"], where, "model_ema")
    load_optimizer(state.optimizer, ckpt["optimizer"], where)
    state.sched.load_state_dict(ckpt["scheduler"])
    if state.scaler is not None and ckpt.get("scaler"):
        state.scaler.load_state_dict(ckpt["scaler"])
    state.epoch, state.step_in_epoch, state.step = int(ckpt["epoch"]), int(ckpt["step_in_epoch"]), int(ckpt["step"])
    state.history = list(ckpt.get("history", []))
    state.elapsed_s = float(ckpt.get("elapsed_s", 0.0))
    ranks = ckpt.get("rank_states") or []
    return ranks if len(ranks) == world_size else None
