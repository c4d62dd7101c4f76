"""The model families' constructor arguments, typed and ranged: checked once, before a model is built.

An argument's type is its annotation in the family's constructor (``patch_size: int``,
``depths: Sequence[int]``, ``local_residual: Optional[bool]``), its range the entry of
:data:`ARG_RANGES` under its name (the families share their argument names, so one table serves
all four). :func:`check_model_args` checks every argument given against both, so that
:func:`~inline_attn.models.create_model`, :func:`~inline_attn.models.from_pretrained` (a
``config.json``'s ``model_args``) and the command line (a config's ``model.args``) refuse the same
value with the same message: a bool is a bool (``qkv_bias="no"`` is refused, not truthy), an integer
is an integer (``patch_size=8.0`` is refused), a number is finite, a rate lies in [0, 1), a ratio or
size is positive. What depends on several arguments (a pattern's letters and mixed-block count
against the depths, per-stage lengths) is checked by the constructors.
"""

from __future__ import annotations

import difflib
import inspect
import math
import types
import typing
from collections.abc import Sequence as AbcSequence
from dataclasses import dataclass
from typing import Any, Optional, Union

from ..ops.dispatch import IMPLS

__all__ = ["ARG_RANGES", "Range", "check_model_args", "expected_of"]


@dataclass(frozen=True)
class Range:
    """The range every number of an argument must lie in (each element of a sequence), and an
    optional plain-words description that replaces the generated one."""

    ge: Optional[float] = None
    gt: Optional[float] = None
    lt: Optional[float] = None
    choices: Optional[tuple] = None
    what: Optional[str] = None

    def holds(self, v) -> bool:
        if self.choices is not None:
            return v in self.choices
        return (
            (self.ge is None or v >= self.ge) and (self.gt is None or v > self.gt) and (self.lt is None or v < self.lt)
        )

    def words(self) -> str:
        if self.ge is not None and self.lt is not None:
            return f" in [{self.ge:g}, {self.lt:g})"
        if self.ge is not None:
            return f" >= {self.ge:g}"
        if self.gt is not None:
            return f" > {self.gt:g}"
        return ""


_SIZE = Range(ge=1)
_RATE = Range(ge=0, lt=1)
_POSITIVE = Range(gt=0)

#: argument name -> the range of its numbers (an argument not listed has only its type checked)
ARG_RANGES: dict[str, Range] = {
    "img_size": Range(ge=1, what="a positive integer or a (height, width) pair of them"),
    "num_classes": Range(ge=0, what="an integer >= 0 (0: no classifier head)"),
    "in_chans": _SIZE,
    "patch_size": _SIZE,
    "embed_dim": _SIZE,
    "embed_dims": _SIZE,
    "depth": _SIZE,
    "depths": _SIZE,
    "num_heads": _SIZE,
    "window_size": _SIZE,
    "sr_ratios": _SIZE,
    "split_size": _SIZE,
    "inline_split_size": _SIZE,
    "mlp_ratio": _POSITIVE,
    "mlp_ratios": _POSITIVE,
    "norm_eps": _POSITIVE,
    "drop_rate": _RATE,
    "attn_drop_rate": _RATE,
    "drop_path_rate": _RATE,
    "impl": Range(choices=IMPLS, what=f"one of {IMPLS}, or None for the process default"),
}


def _describe(tp, rng: Range) -> str:
    """``tp`` and ``rng`` in words: "an integer >= 1", "a list of numbers > 0", "true, false or None"."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        inner = [_describe(a, rng) for a in args if a is not type(None)]
        return " or ".join(inner) + (", or None" if type(None) in args else "")
    if origin in (tuple, AbcSequence):
        item = args[0] if args else Any
        plural = {int: "integers", float: "numbers", str: "strings"}.get(item, "values")
        count = f"{len(args)} " if origin is tuple and Ellipsis not in args else ""
        return f"a list of {count}{plural}{rng.words()}"
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    return names.get(tp, getattr(tp, "__name__", str(tp))) + ("" if tp in (bool, str) else rng.words())


def expected_of(name: str, tp) -> str:
    """What an argument ``name`` of type ``tp`` must be, in words (the message's "expected ...")."""
    rng = ARG_RANGES.get(name, Range())
    return rng.what or _describe(tp, rng)


def _fits(value, tp, rng: Range) -> bool:
    """Whether ``value`` is of type ``tp`` (bools are not numbers, ints are not floats' only
    stand-in: 8.0 is no integer) with every number within ``rng``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(_fits(value, a, rng) for a in args)
    if tp is type(None):
        return value is None
    if origin in (tuple, AbcSequence):
        if not isinstance(value, (list, tuple)) or not value:
            return False
        if origin is tuple and Ellipsis not in args and len(value) != len(args):
            return False
        return all(_fits(v, args[0] if args else Any, rng) for v in value)
    if tp is bool or tp is str:
        return isinstance(value, tp) and (rng.choices is None or value in rng.choices)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool) and rng.holds(value)
    if tp is float:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return number and math.isfinite(value) and rng.holds(value)
    return True  # a type this table does not describe (a callable): the constructor checks it


def _signature_types(cls: type) -> dict[str, Any]:
    """Constructor argument name -> annotated type (``Any`` where unannotated)."""
    hints = typing.get_type_hints(cls.__init__)
    params = inspect.signature(cls.__init__).parameters
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {n: hints.get(n, Any) for n, p in params.items() if n != "self" and p.kind in named}


def check_model_args(name: str, cls: type, args: dict) -> None:
    """ValueError for the first argument in ``args`` that ``cls``'s constructor (the model
    ``name``'s) does not take or whose value does not fit its annotated type and its
    :data:`ARG_RANGES` range: ``create_model('inline_deit_tiny', patch_size=8.0): expected an integer >= 1``."""
    types_ = _signature_types(cls)
    for key, value in args.items():
        if key not in types_:
            close = difflib.get_close_matches(str(key), list(types_), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(f"model {name!r} takes no argument {key!r}{hint}")
        tp = types_[key]
        if not _fits(value, tp, ARG_RANGES.get(key, Range())):
            raise ValueError(f"create_model({name!r}, {key}={value!r}): expected {expected_of(key, tp)}")
