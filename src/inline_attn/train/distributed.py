"""Moved to :mod:`inline_attn.runtime.distributed` (shared by every task); this name stays for old imports."""

from ..runtime.distributed import (
    SEED_STRIDE,
    DistInfo,
    all_reduce,
    all_reduce_sum,
    barrier,
    cleanup,
    init_distributed,
    resolve_device,
)

__all__ = [
    "SEED_STRIDE",
    "DistInfo",
    "all_reduce",
    "all_reduce_sum",
    "barrier",
    "cleanup",
    "init_distributed",
    "resolve_device",
]
