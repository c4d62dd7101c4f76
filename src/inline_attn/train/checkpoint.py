"""Training checkpoints: written atomically, the previous one kept, read back with clear errors.

Every save writes ``last.pth`` atomically (:func:`inline_attn._io.atomic_path`) and keeps the
checkpoint it replaces as ``previous.pth``, so ``--resume auto`` falls back to the previous one
when the newest cannot be read. Resuming checks the checkpoint against the run continuing it:
the config (only :data:`~inline_attn.train.config.RESUME_MAY_CHANGE` may differ), the number of
processes and the steps per epoch, then the weights and optimizer state, each mismatch a
ValueError naming the file and what differs.
"""

from __future__ import annotations

import logging
import os
import pathlib
import random
import shutil
import time
from typing import Any, Optional, Union

import numpy as np
import torch

from .._io import atomic_path
from ..models.checkpoint import read_checkpoint
from .config import Config, resume_differences
from .state import TrainState

PathLike = Union[str, os.PathLike]
LAST = "last.pth"
PREVIOUS = "previous.pth"
BEST = "best.pth"  # the epoch with the best top-1 so far (the authors' max_acc.pth)
BEST_EMA = "best_ema.pth"  # the epoch with the best EMA top-1 (max_ema_acc.pth)
REQUIRED_KEYS = ("model", "optimizer", "scheduler", "epoch", "step_in_epoch", "step")

log = logging.getLogger(__name__)


def atomic_save(obj: Any, path: PathLike) -> pathlib.Path:
    """``torch.save(obj)`` to ``path`` atomically."""
    path = pathlib.Path(path)
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
    return path


def save_rotating(obj: Any, folder: PathLike) -> pathlib.Path:
    """Write ``folder/last.pth`` atomically, keeping the checkpoint it replaces as ``previous.pth``."""
    folder = pathlib.Path(folder)
    last = folder / LAST
    with atomic_path(last) as tmp:
        torch.save(obj, tmp)
        if last.exists():  # a crash between the two renames leaves previous.pth to resume from
            os.replace(last, folder / PREVIOUS)
    return last


def copy_atomic(src: PathLike, dst: PathLike) -> pathlib.Path:
    """Copy the file ``src`` to ``dst`` atomically (a reader sees the old or the new file whole)."""
    dst = pathlib.Path(dst)
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)
    return dst


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


def find_resume(output: PathLike) -> list[pathlib.Path]:
    """The checkpoints ``--resume auto`` may continue from, newest first."""
    folder = pathlib.Path(output)
    return [p for p in (folder / LAST, folder / PREVIOUS) if p.is_file()]


def load_resume(resume: Optional[str], output: PathLike) -> Optional[tuple[pathlib.Path, dict]]:
    """``(path, checkpoint)`` to resume from, or None to start afresh.

    ``"auto"``: the output folder's newest readable checkpoint (an unreadable ``last.pth`` is
    reported and ``previous.pth`` used); none there starts a new run. A path: that file.
    """
    if not resume:
        return None
    if resume != "auto":
        return pathlib.Path(resume), load(resume)
    errors = []
    for path in find_resume(output):
        try:
            ckpt = load(path)
        except ValueError as e:
            errors.append(str(e))
            log.warning("%s; trying the previous checkpoint", e)
            continue
        if errors:
            log.warning("resuming from %s (the newer checkpoint is unreadable)", path)
        return path, ckpt
    if errors:
        raise ValueError("no readable checkpoint to resume from in " + str(output) + ": " + "; ".join(errors))
    return None


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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
        "optimizer": state.optimizer.state_dict(),
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
    diffs = resume_differences(ckpt.get("config") or {}, cfg)
    if diffs:
        raise ValueError(
            f"cannot resume from {where}: the config differs in settings that shape the training: "
            f"{'; '.join(diffs)}. Restore them, or start a new run in another --output"
        )
    saved_world = int(ckpt.get("world_size", world_size))
    if saved_world != world_size:
        raise ValueError(
            f"cannot resume from {where}: it was trained on {saved_world} processes, this run has "
            f"{world_size} (the total batch, the learning rate and the schedule would change)"
        )
    saved_steps = ckpt.get("steps_per_epoch")
    if saved_steps is not None and int(saved_steps) != steps_per_epoch:
        raise ValueError(
            f"cannot resume from {where}: an epoch had {saved_steps} steps, now {steps_per_epoch} "
            "(the training data changed)"
        )
    _load_module(state.model, ckpt["model"], where, "model")
    if state.ema is not None and ckpt.get("model_ema"):
        _load_module(state.ema.module, ckpt["model_ema"], where, "model_ema")
    _load_optimizer(state.optimizer, ckpt["optimizer"], where)
    state.sched.load_state_dict(ckpt["scheduler"])
    if state.scaler is not None and ckpt.get("scaler"):
        state.scaler.load_state_dict(ckpt["scaler"])
    state.epoch, state.step_in_epoch, state.step = int(ckpt["epoch"]), int(ckpt["step_in_epoch"]), int(ckpt["step"])
    state.history = list(ckpt.get("history", []))
    state.elapsed_s = float(ckpt.get("elapsed_s", 0.0))
    ranks = ckpt.get("rank_states") or []
    return ranks if len(ranks) == world_size else None


def _load_module(module: torch.nn.Module, sd: dict, where: str, what: str) -> None:
    own = module.state_dict()
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    shapes = [
        f"{k} {list(sd[k].shape)} vs {list(own[k].shape)}"
        for k in sd
        if k in own and tuple(sd[k].shape) != tuple(own[k].shape)
    ]
    if missing or unexpected or shapes:
        parts = [
            f"{name} ({len(keys)}): {', '.join(keys[:5])}{', ...' if len(keys) > 5 else ''}"
            for name, keys in (
                ("missing keys", missing),
                ("unexpected keys", unexpected),
                ("wrongly-shaped keys (file vs model)", shapes),
            )
            if keys
        ]
        raise ValueError(f"{where}: its {what} weights do not fit the model built from the config: " + "; ".join(parts))
    module.load_state_dict(sd)


def _load_optimizer(optimizer: torch.optim.Optimizer, sd: dict, where: str) -> None:
    own, saved = optimizer.state_dict()["param_groups"], sd.get("param_groups", [])
    if len(own) != len(saved) or any(set(a) - {"params"} != set(b) - {"params"} for a, b in zip(own, saved)):
        raise ValueError(
            f"{where}: its optimizer state ({sorted(set(saved[0]) - {'params'}) if saved else []}) "
            f"does not fit {type(optimizer).__name__}"
        )
    try:
        optimizer.load_state_dict(sd)
    except (ValueError, KeyError) as e:
        raise ValueError(f"{where}: its optimizer state does not fit this run's optimizer ({e})") from None
