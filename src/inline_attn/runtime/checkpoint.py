"""Run checkpoints for every task: written atomically, the previous one kept, read back with
clear errors, one resume path.

Every save writes ``last.pth`` atomically (:func:`inline_attn._io.atomic_path`) and keeps the
checkpoint it replaces as ``previous.pth``, so ``--resume auto`` falls back to the previous one
when the newest cannot be read. A fallback moves the unreadable ``last.pth`` aside (to
``last.pth.unreadable``) so the next save cannot rotate it over the good ``previous.pth``; when
neither can be read the resume stops with an error instead of starting again at step 0 over
them. Weights and optimizer state are loaded only when they fit, each mismatch a ValueError
naming the file and what differs.
"""

from __future__ import annotations

import logging
import os
import pathlib
import random
import shutil
from typing import Any, Callable, Optional, Union

import numpy as np
import torch

from .._io import atomic_path, read_checkpoint

PathLike = Union[str, os.PathLike]
LAST = "last.pth"
PREVIOUS = "previous.pth"
BEST = "best.pth"  # the row with the best Task.best_key so far (the authors' max_acc.pth)
BEST_EMA = "best_ema.pth"  # the best <best_key>_ema (max_ema_acc.pth)
UNREADABLE_SUFFIX = ".unreadable"
# what every run checkpoint holds (a task's checkpoint_keys add to it)
RUN_KEYS = ("model", "optimizer", "scheduler", "step", "config")

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


def find_resume(output: PathLike) -> list[pathlib.Path]:
    """The checkpoints ``--resume auto`` may continue from, newest first."""
    folder = pathlib.Path(output)
    return [p for p in (folder / LAST, folder / PREVIOUS) if p.is_file()]


def load_resume(
    resume: Optional[str], output: PathLike, load: Callable[[PathLike], dict]
) -> Optional[tuple[pathlib.Path, dict]]:
    """``(path, checkpoint)`` to resume from, or None to start afresh; ``load`` reads and checks
    one file (a ValueError naming it when it is not a checkpoint of the task).

    ``"auto"``: the output folder's newest readable checkpoint. An unreadable ``last.pth`` is
    reported and moved aside (``last.pth.unreadable``), ``previous.pth`` used; no checkpoint
    there starts a new run; checkpoints there that cannot be read stop the run (ValueError) so
    they are not overwritten. A path: that file.
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
            _set_aside(pathlib.Path(output) / LAST)
        return path, ckpt
    if errors:
        raise ValueError(
            f"no readable checkpoint to resume from in {output}: {'; '.join(errors)}. Move them away to "
            "start a new run there, or resume from another checkpoint path"
        )
    return None


def _set_aside(path: pathlib.Path) -> None:
    """Rename an unreadable checkpoint out of the rotation (kept for inspection)."""
    try:
        os.replace(path, path.with_name(path.name + UNREADABLE_SUFFIX))
    except FileNotFoundError:  # another process of the run moved it first
        pass


def read_run_checkpoint(path: PathLike, keys: tuple = RUN_KEYS, kind: str = "training") -> dict:
    """The one reader of run checkpoints: the file read (a ValueError naming it and why when it
    cannot be), then checked to hold ``keys`` (a ValueError naming the file, what it lacks and how
    to start from its weights instead)."""
    # ours hold config dicts, RNG states and numpy arrays beside the weights: not weights_only-safe
    state = read_checkpoint(path, weights_only=False)
    missing = [k for k in keys if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(
            f"checkpoint {str(path)!r} is not a {kind} checkpoint of an inline-attn run (no {', '.join(missing)}); "
            "to start from its weights use --model.checkpoint instead of --resume"
        )
    return state


def rank_states(state: dict) -> list[dict]:
    """Each process's entry of a run checkpoint (``{"rng": ..., **the task's}``); a checkpoint of
    an earlier segmentation or detection run (torch RNG states under ``rng``) reads the same way."""
    ranks = state.get("rank_states")
    if ranks is None:
        old = state.get("rng")
        old = [old] if isinstance(old, torch.Tensor) else (old or [])
        ranks = [{"rng": {"torch": r}} for r in old]
    return list(ranks)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """The generators :func:`rng_state` saved (those it holds)."""
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        np.random.set_state(state["numpy"])
    if "python" in state:
        random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def check_resume(where: str, differences: list[str], saved_world: Optional[int], world_size: int) -> None:
    """Refuse to continue a run whose training-shaping settings (``differences``, from
    :meth:`~inline_attn.runtime.config.TypedConfig.differences`) or number of processes changed."""
    if differences:
        raise ValueError(
            f"cannot resume from {where}: the config differs in settings that shape the training: "
            f"{'; '.join(differences)}. Restore them, or start a new run in another --output"
        )
    if saved_world is not None and int(saved_world) != world_size:
        raise ValueError(
            f"cannot resume from {where}: it was trained on {saved_world} processes, this run has "
            f"{world_size} (the total batch, the learning rate and the schedule would change)"
        )


def load_module(module: torch.nn.Module, sd: dict, where: str, what: str) -> None:
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


def load_optimizer(optimizer: torch.optim.Optimizer, sd: dict, where: str) -> None:
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
