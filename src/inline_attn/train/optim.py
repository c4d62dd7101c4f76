"""Moved to :mod:`inline_attn.runtime.optim` (shared by every task); this name stays for old imports."""

from ..runtime.optim import OPTIMIZERS, CosineSchedule, build_optimizer, no_decay_names, param_groups

__all__ = ["OPTIMIZERS", "CosineSchedule", "build_optimizer", "no_decay_names", "param_groups"]
