"""Shared by the ops tests: a log of the aten / custom ops a piece of code dispatches."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OpLog(TorchDispatchMode):
    """Records every dispatched op as (name, [(shape, dtype) of its tensor arguments]); under it
    the fused InLine core runs as its custom op, so its calls and arguments are seen too."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, list]] = []

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = [(tuple(a.shape), a.dtype) for a in args if isinstance(a, torch.Tensor)]
        self.calls.append((func.overloadpacket.__name__, tensors))
        return func(*args, **(kwargs or {}))
