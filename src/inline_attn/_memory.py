"""Telling an out-of-memory failure from other errors, on any device: the benchmarks record it as a
result ("OOM"), the MAC count (:func:`inline_attn.models.profile.profile`) refuses the input size."""

from __future__ import annotations

import torch


def is_oom(err: BaseException) -> bool:
    """True for an out-of-memory failure on any device (CUDA, or a failed CPU allocation)."""
    if isinstance(err, (MemoryError, torch.OutOfMemoryError)):
        return True
    msg = str(err).lower()
    return isinstance(err, RuntimeError) and (
        "out of memory" in msg or "can't allocate memory" in msg or "not enough memory" in msg
    )
