"""Mixed precision for every task: the one amp vocabulary, the autocast context and the ``auto``
choice.

:data:`AMP_DTYPES` names the precisions a run trains in (``none``, ``bf16``, ``fp16``: the
``train.amp`` setting's values besides ``auto``); :data:`AMP_NAMES` maps every spelling the library
takes (torch's dtype names and dtypes, ``fp32``, ``half``) onto them.
"""

from __future__ import annotations

import contextlib
from typing import Optional, Union

import torch

__all__ = ["AMP_DTYPES", "AMP_NAMES", "amp_dtype", "amp_name", "autocast", "grad_scaler", "resolve_amp"]

AmpLike = Union[None, str, torch.dtype]

# the precisions a step runs in -> autocast's dtype (None: no autocast, full fp32)
AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# every accepted spelling -> its name in AMP_DTYPES
AMP_NAMES = {
    None: "none",
    "none": "none",
    "fp32": "none",
    "float32": "none",
    torch.float32: "none",
    "bf16": "bf16",
    "bfloat16": "bf16",
    torch.bfloat16: "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    torch.float16: "fp16",
}


def amp_name(amp: AmpLike) -> str:
    """``amp`` (any spelling of :data:`AMP_NAMES`) as ``none``, ``bf16`` or ``fp16``; ValueError
    naming the value otherwise."""
    if not (amp is None or isinstance(amp, (str, torch.dtype))) or amp not in AMP_NAMES:
        names = ", ".join(repr(k) for k in AMP_NAMES if isinstance(k, str))
        raise ValueError(f"amp={amp!r}: expected None, one of {names}, or torch.float32 / bfloat16 / float16")
    return AMP_NAMES[amp]


def amp_dtype(amp: AmpLike) -> Optional[torch.dtype]:
    """The autocast dtype of ``amp`` (None: no autocast)."""
    return AMP_DTYPES[amp_name(amp)]


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
