"""Loading the authors' checkpoints (and our own) into our models; saving ours as safetensors.

``load_checkpoint(model, source)`` reads a path (the authors' ``.pth``, ``{"model": sd}`` or
another wrapper, or a ``.safetensors`` file written by :func:`save_checkpoint`) or a mapping,
unwraps it, passes it through the model family's filter (key mapping, position-embedding
resizing: ``checkpoint_filter_fn(state_dict, model)``, a static method of the model class), and
loads it. Every key of the file must be consumed and every parameter of the model given; only
buffers the model recomputes (relative position indices, shift masks) may be absent or left over,
and a pruned model (``features_only``) drops the file's entries for the modules it pruned.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch
import torch.nn as nn

from .._io import atomic_path, read_checkpoint

__all__ = [
    "LoadResult",
    "RECOMPUTED_BUFFERS",
    "load_checkpoint",
    "read_state_dict",
    "save_checkpoint",
    "unwrap_state_dict",
]

# buffer names (last key component) that models rebuild for the actual input size
RECOMPUTED_BUFFERS = ("relative_position_index", "attn_mask")
# wrapper keys of training checkpoints, tried in this order
WRAPPER_KEYS = ("model", "state_dict", "model_ema", "module")
# keys holding the EMA weights of a training checkpoint (ours, timm's)
EMA_KEYS = ("model_ema", "state_dict_ema")

FilterFn = Callable[[dict, nn.Module], dict]


@dataclass
class LoadResult:
    """What a load did: keys of the model the file lacked, file keys the model has no place
    for, keys whose shapes disagree (key, file shape, model shape), recomputed buffers skipped."""

    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, tuple, tuple]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def describe(self, limit: int = 10) -> str:
        def some(items):
            shown = ", ".join(str(i) for i in items[:limit])
            return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")

        parts = []
        if self.missing:
            parts.append(f"missing keys ({len(self.missing)}): {some(self.missing)}")
        if self.unexpected:
            parts.append(f"unexpected keys ({len(self.unexpected)}): {some(self.unexpected)}")
        if self.mismatched:
            rows = [f"{k} (file {list(a)} vs model {list(b)})" for k, a, b in self.mismatched]
            parts.append(f"wrongly-shaped keys ({len(rows)}): {some(rows)}")
        return "; ".join(parts)


def _is_state_dict(obj) -> bool:
    return isinstance(obj, Mapping) and len(obj) > 0 and all(isinstance(v, torch.Tensor) for v in obj.values())


def unwrap_state_dict(obj, *, ema: bool = False, where: str = "mapping") -> dict:
    """The model weights inside a loaded checkpoint object.

    Accepts a bare state dict, one wrapped in ``model`` / ``state_dict`` / ``model_ema`` /
    ``module`` (nested up to three levels, as the authors' and timm's checkpoints are) and strips
    a DDP ``module.`` prefix. ``ema=True`` takes the EMA weights (``model_ema`` or
    ``state_dict_ema``) and raises ValueError when there are none. ``where`` names the source in
    error messages.
    """
    if ema:
        if not isinstance(obj, Mapping):
            raise ValueError(f"checkpoint {where} holds a {type(obj).__name__}, expected a mapping")
        inner = next((obj[k] for k in EMA_KEYS if isinstance(obj.get(k), Mapping)), None)
        if inner is None:
            raise ValueError(f"checkpoint {where} holds no EMA weights ({' or '.join(EMA_KEYS)})")
        obj = inner
    for _ in range(3):  # wrappers nest at most a couple of levels ({"state_dict": {"model": ...}})
        if _is_state_dict(obj):
            break
        if not isinstance(obj, Mapping):
            raise ValueError(f"checkpoint {where} holds a {type(obj).__name__}, expected a state dict mapping")
        inner = next((obj[k] for k in WRAPPER_KEYS if isinstance(obj.get(k), Mapping)), None)
        if inner is None:
            raise ValueError(
                f"checkpoint {where} is neither a state dict (name -> tensor) nor wrapped in one of "
                f"{WRAPPER_KEYS}; top-level keys: {sorted(map(str, obj))[:10]}"
            )
        obj = inner
    if not _is_state_dict(obj):
        raise ValueError(f"checkpoint {where} holds no tensors")
    sd = dict(obj)
    if all(k.startswith("module.") for k in sd):  # saved from DistributedDataParallel
        sd = {k[len("module.") :]: v for k, v in sd.items()}
    return sd


def read_state_dict(source: Union[str, os.PathLike, Mapping], *, weights_only: bool = True, ema: bool = False) -> dict:
    """A path (``.safetensors`` or a torch pickle) or a mapping -> a bare state dict on CPU.

    See :func:`read_checkpoint` (``weights_only``, errors) and :func:`unwrap_state_dict` (``ema``).
    """
    if isinstance(source, Mapping):
        return unwrap_state_dict(source, ema=ema, where="mapping")
    return unwrap_state_dict(read_checkpoint(source, weights_only=weights_only), ema=ema, where=repr(str(source)))


def _filter_fn(model: nn.Module) -> Optional[FilterFn]:
    if getattr(type(model), "checkpoint_filter_fn", None) is None:
        return None
    return getattr(model, "checkpoint_filter_fn")  # a staticmethod: fn(state_dict, model)


def _drop_pruned(state: dict, model: nn.Module) -> dict:
    """The file's entries minus those of modules the model pruned (``model.pruned_modules``)."""
    pruned = tuple(getattr(model, "pruned_modules", ()))
    if not pruned:
        return state
    prefixes = tuple(p + "." for p in pruned)
    return {k: v for k, v in state.items() if k not in pruned and not k.startswith(prefixes)}


def _is_recomputed(key: str) -> bool:
    return key.rsplit(".", 1)[-1] in RECOMPUTED_BUFFERS


def load_checkpoint(
    model: nn.Module,
    source: Union[str, os.PathLike, Mapping],
    strict: bool = True,
    *,
    weights_only: bool = True,
    filter_fn: Optional[FilterFn] = None,
) -> LoadResult:
    """Load ``source`` into ``model``; returns a :class:`LoadResult`.

    Args:
        model: the model (its parameters keep their device and dtype; values are copied in).
            A model built on the meta device takes the file's tensors instead. A
            ``features_only`` model takes a checkpoint of the full model (the pruned parts'
            entries are dropped) or of itself.
        source: path to the authors' ``.pth`` (``{"model": sd}``, ``{"state_dict": sd}``,
            ``{"model_ema": sd}``), a bare state dict, or our ``.safetensors`` file.
        strict: raise ValueError listing missing, unexpected and wrongly-shaped keys when the
            file and the model disagree; with False, load the keys that fit and report the rest.
        weights_only: see :func:`read_state_dict`.
        filter_fn: ``fn(state_dict, model)`` replacing the family's own filter.

    A ``model`` that is no module or a ``source`` that is neither a path nor a mapping is a ValueError.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"load_checkpoint: model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(source, (str, os.PathLike, Mapping)):
        raise ValueError(f"load_checkpoint: source={source!r}: expected a checkpoint path or a state dict (a mapping)")
    state = read_state_dict(source, weights_only=weights_only)
    fn = filter_fn or _filter_fn(model)
    if fn is not None:
        state = fn(state, model)
    state = _drop_pruned(state, model)
    own = model.state_dict()
    result = LoadResult()
    loadable = {}
    for key, value in state.items():
        if key not in own:
            (result.ignored if _is_recomputed(key) else result.unexpected).append(key)
        elif tuple(value.shape) != tuple(own[key].shape):
            if _is_recomputed(key):
                result.ignored.append(key)
            else:
                result.mismatched.append((key, tuple(value.shape), tuple(own[key].shape)))
        else:
            loadable[key] = value
    result.missing = [k for k in own if k not in state and not _is_recomputed(k)]
    if strict and not result.ok:
        raise ValueError(f"checkpoint does not fit {type(model).__name__}: {result.describe()}")
    # a model built on the meta device (no memory) takes the file's tensors as its own
    assign = any(t.is_meta for t in own.values())
    model.load_state_dict(loadable, strict=False, assign=assign)
    return result


def save_checkpoint(
    model: Union[nn.Module, Mapping], path: Union[str, os.PathLike], metadata: Optional[dict[str, str]] = None
) -> pathlib.Path:
    """Write the model's state dict to ``path`` as safetensors, atomically.

    The file appears complete or not at all (:func:`inline_attn._io.atomic_path`).
    Tensors that share storage (tied weights) are stored once each as separate copies, which
    safetensors requires; loading copies them back into the tied parameter.
    """
    path = pathlib.Path(path)
    state = model.state_dict() if isinstance(model, nn.Module) else dict(model)
    tensors, seen = {}, set()
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"state dict entry {key!r} is a {type(value).__name__}, not a tensor")
        t = value.detach().cpu()
        storage = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) if t.numel() else None
        if storage in seen or not t.is_contiguous():
            t = t.contiguous().clone()
        elif storage is not None:
            seen.add(storage)
        tensors[key] = t
    meta = {"format": "pt", "writer": "inline_attn"}
    cfg = getattr(model, "pretrained_cfg", None)
    if cfg is not None and getattr(cfg, "name", None):
        meta["model"] = str(cfg.name)
    meta.update({str(k): str(v) for k, v in (metadata or {}).items()})

    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
    return path
