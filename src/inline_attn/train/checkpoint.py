"""Checkpoints that lose nothing: written to a temporary file, fsynced, then renamed.

``os.replace`` is atomic on POSIX, so a reader (or a resume after a crash mid-write) sees either
the previous complete file or the new complete file, never a torn one.
"""
from __future__ import annotations

import os
import pathlib
import random
from typing import Any, Optional, Union

import numpy as np
import torch

PathLike = Union[str, os.PathLike]
LAST = "last.pth"


def atomic_save(obj: Any, path: PathLike) -> pathlib.Path:
    """``torch.save(obj)`` to ``path`` atomically (temp file in the same folder + fsync + rename)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    try:  # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
    return path


def load(path: PathLike, map_location="cpu") -> dict:
    """Load a checkpoint written by :func:`atomic_save` (or any ``torch.save`` dict)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint {path} does not exist")
    # our checkpoints hold config dicts, RNG states and numpy arrays: not weights_only-safe
    return torch.load(path, map_location=map_location, weights_only=False)


def find_resume(output: PathLike) -> Optional[pathlib.Path]:
    """The checkpoint ``--resume auto`` continues from: ``<output>/last.pth`` if present."""
    p = pathlib.Path(output) / LAST
    return p if p.is_file() else None


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


def model_state_dict(ckpt: dict, *, ema: bool = False) -> dict:
    """The model weights of a checkpoint: ours (``model`` / ``model_ema``), timm-style
    (``state_dict``, ``state_dict_ema``) or a bare state dict; a DDP ``module.`` prefix is stripped."""
    if ema:
        for k in ("model_ema", "state_dict_ema"):
            if isinstance(ckpt.get(k), dict):
                sd = ckpt[k]
                break
        else:
            raise ValueError("the checkpoint holds no EMA weights (model_ema)")
    else:
        sd = next((ckpt[k] for k in ("model", "state_dict") if isinstance(ckpt.get(k), dict)), ckpt)
    if any(k.startswith("module.") for k in sd):
        sd = {k[len("module."):] if k.startswith("module.") else k: v for k, v in sd.items()}
    return sd
