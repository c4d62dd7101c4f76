"""Mixed precision for every task: the autocast context and the ``auto`` choice."""

from __future__ import annotations

import contextlib
from typing import Optional

import torch


def autocast(device: torch.device, amp: Optional[str]):
    """The autocast context for ``amp`` (none | bf16 | fp16); fp16 needs CUDA."""
    if amp in (None, "none", False):
        return contextlib.nullcontext()
    if amp == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if amp == "fp16":
        if device.type != "cuda":
            raise ValueError("train.amp=fp16 needs CUDA; use bf16 on CPU")
        return torch.autocast("cuda", dtype=torch.float16)
    raise ValueError(f"train.amp={amp!r}: expected auto, none, bf16 or fp16")


def resolve_amp(amp: Optional[str], device: torch.device) -> str:
    """``auto`` as fp16 on CUDA (the authors' --amp on GPUs) and none elsewhere; fp16 without
    CUDA is refused here, before any work."""
    amp = amp or "none"
    if amp == "auto":
        amp = "fp16" if device.type == "cuda" else "none"
    autocast(device, amp)
    return amp


def grad_scaler(amp: str) -> Optional[torch.amp.GradScaler]:
    """A GradScaler for fp16 (CUDA), None otherwise."""
    return torch.amp.GradScaler("cuda") if amp == "fp16" else None
