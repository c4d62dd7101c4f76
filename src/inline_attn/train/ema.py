"""Moved to :mod:`inline_attn.runtime.ema` (shared by every task); this name stays for old imports."""

from ..runtime.ema import ModelEma

__all__ = ["ModelEma"]
