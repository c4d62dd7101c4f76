"""Marks that tell ``torch.compile`` how to treat a function, set without importing ``torch._dynamo``.

``torch.compiler.assume_constant_result(fn)`` imports ``torch._dynamo`` (about 1 s of CPU, sympy
and the distributed packages with it) only to set one attribute on ``fn`` that Dynamo reads while
tracing. Applied at import time it doubled ``import inline_attn``. :func:`constant_when_compiled`
sets the same mark, through Dynamo's own decorator when Dynamo is already loaded and directly
otherwise; ``tests/ops/test_compile_marks.py`` checks that the mark is exactly what
``assume_constant_result`` sets in the installed torch, so a torch that changes the mechanism fails
that test rather than silently tracing these functions.

:func:`exporting` is ``torch.compiler.is_exporting()`` as it should read while Dynamo traces: torch
2.11's Dynamo replaces that call by the constant True under ``torch.compile`` too (pytorch#176347;
2.13's reads the export flag), so code that branches on it there takes its export branch in every
compiled graph.
"""

from __future__ import annotations

import sys
from typing import Callable, TypeVar

import torch

F = TypeVar("F", bound=Callable)

#: the attribute ``torch._dynamo.assume_constant_result`` sets (torch 2.0 onwards)
CONSTANT_MARK = "_dynamo_marked_constant"


def constant_when_compiled(fn: F) -> F:
    """``torch.compiler.assume_constant_result(fn)``, without importing ``torch._dynamo``: under
    ``torch.compile`` the call is evaluated once while tracing and its result becomes a constant."""
    if "torch._dynamo" in sys.modules:
        return torch.compiler.assume_constant_result(fn)
    setattr(fn, CONSTANT_MARK, True)
    return fn


@constant_when_compiled  # Dynamo calls it as Python while tracing (the real flag), not its own stand-in
def exporting() -> bool:
    """True while ``torch.export`` (strict or not, ``torch.onnx.export`` through it) traces, False
    under ``torch.compile`` and in eager mode: ``torch.compiler.is_exporting()`` read by Python.

    Under ``torch.compile`` torch 2.11's Dynamo answers that call with the constant True (a table
    of tracing-state functions it folds), whatever is being traced; a function marked constant is
    instead run as Python once while tracing, and reads the flag that ``torch.export`` sets."""
    return torch.compiler.is_exporting()
