"""A per-geometry cache of constant tensors that tracing cannot poison.

``torch.export`` (and so ONNX export) runs the model's Python code on fake tensors. A plain
``functools.lru_cache`` around a function that builds a tensor would then keep a fake tensor, with
no values, and hand it to every later eager call of every model in the process. :func:`tensor_cache`
keeps only real tensors: one built while tracing is returned but not stored.
"""

from __future__ import annotations

import collections
import functools
from typing import Callable, Hashable

import torch
from torch._guards import detect_fake_mode

__all__ = ["TensorCache", "tensor_cache"]


def _storable(t: torch.Tensor) -> bool:
    # exactly torch.Tensor: FakeTensor and the functional tensors of tracing are subclasses;
    # meta tensors hold no values either (cheap to rebuild)
    return type(t) is torch.Tensor and t.device.type != "meta"


class TensorCache:
    """``build(*key) -> Tensor``, memoized for up to ``maxsize`` keys (least recently used out).

    While ``torch.compile`` / ``torch.export`` trace or a ``FakeTensorMode`` is active, the cache is
    bypassed (the build becomes part of the graph, or a fake tensor); a fake or meta result is never
    stored. The tensor is built outside inference
    mode, so one first made under ``torch.inference_mode()`` still serves training. Callers must
    not modify the result in place.
    """

    def __init__(self, build: Callable[..., torch.Tensor], maxsize: int = 64):
        if maxsize < 1:
            raise ValueError(f"maxsize={maxsize}: expected at least 1")
        self._build, self._maxsize = build, maxsize
        self._store: collections.OrderedDict[Hashable, torch.Tensor] = collections.OrderedDict()
        functools.update_wrapper(self, build)

    def __call__(self, *key: Hashable) -> torch.Tensor:
        # under FakeTensorMode the key (a device "cpu") cannot tell fake from real: a stored real
        # tensor must not enter the fake computation, nor a fake one be stored
        if torch.compiler.is_compiling() or detect_fake_mode() is not None:
            return self._build(*key)
        hit = self._store.get(key)
        if hit is not None:
            self._store.move_to_end(key)
            return hit
        with torch.inference_mode(False):
            t = self._build(*key)
        if _storable(t):
            self._store[key] = t
            if len(self._store) > self._maxsize:
                self._store.popitem(last=False)
        return t

    def cache_clear(self) -> None:
        """Forget every stored tensor (as ``functools.lru_cache``'s)."""
        self._store.clear()

    def __len__(self) -> int:
        return len(self._store)


def tensor_cache(maxsize: int = 64) -> Callable[[Callable[..., torch.Tensor]], TensorCache]:
    """Decorator form of :class:`TensorCache`: ``@tensor_cache(maxsize=64)``."""
    return lambda build: TensorCache(build, maxsize)
