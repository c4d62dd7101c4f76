"""``constant_when_compiled`` marks a function exactly as ``torch.compiler.assume_constant_result`` does,
whether or not ``torch._dynamo`` is loaded yet; ``exporting`` tells export from compile under Dynamo."""

from __future__ import annotations

import ast
import pathlib
import sys

import torch

import inline_attn
from inline_attn.ops import dispatch
from inline_attn.ops.compile_marks import constant_when_compiled, exporting
from inline_attn.ops.fused import cpu


def test_the_mark_set_without_dynamo_is_what_torch_sets(monkeypatch):
    def ours():
        return 1

    def theirs():
        return 1

    monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)  # the path taken at import
    assert constant_when_compiled(ours) is ours
    monkeypatch.undo()
    assert torch.compiler.assume_constant_result(theirs) is theirs
    assert vars(ours) == vars(theirs) and vars(ours)


def test_the_library_functions_carry_the_mark():
    def reference():
        return 1

    mark = vars(torch.compiler.assume_constant_result(reference))
    for fn in (cpu.cpu_kernel_available, dispatch._triton_importable, dispatch._triton_interpreting, exporting):
        assert {k: getattr(fn, k, None) for k in mark} == mark, fn.__name__


class _Branches(torch.nn.Module):
    """(x * 3 where ``exporting()`` holds else x * 2, the same for ``torch.compiler.is_exporting()``)."""

    def forward(self, x):
        return x * (3 if exporting() else 2), x * (3 if torch.compiler.is_exporting() else 2)


def _folded_as_torch_2_11():
    # torch 2.11's Dynamo answers torch.compiler.is_exporting() with the constant True while it traces
    # (pytorch#176347); 2.13's reads the export flag. A function that Dynamo folds to True and Python
    # reads as False stands in for it, so that this torch traces as 2.11 does.
    return torch.compiler.is_dynamo_compiling()


def test_exporting_is_false_under_compile_and_true_under_export(monkeypatch):
    x = torch.ones(1)
    assert [t.item() for t in _Branches()(x)] == [2, 2]
    for strict in (True, False):
        exported = torch.export.export(_Branches(), (x,), strict=strict).module()
        assert exported(x)[0].item() == 3, strict
    monkeypatch.setattr(torch.compiler, "is_exporting", _folded_as_torch_2_11)
    torch._dynamo.reset()
    ours, folded = torch.compile(_Branches(), backend="aot_eager", fullgraph=True)(x)
    torch._dynamo.reset()
    # the stand-in folds as torch 2.11 does (the export branch, in a compiled graph), exporting() does not
    assert (ours.item(), folded.item()) == (2, 3)


def test_the_library_asks_exporting_never_torch_directly():
    # A call to torch.compiler.is_exporting() in code that torch.compile traces reads True on torch 2.11
    # (above): the layers would take their export branches in every compiled graph (the Triton
    # backend's opaque op instead of its kernels, the residual's multiply-adds instead of one
    # convolution). The library asks compile_marks.exporting() instead.
    src = pathlib.Path(inline_attn.__file__).parent
    direct = [
        f"{path.relative_to(src)}:{node.lineno}"
        for path in sorted(src.rglob("*.py"))
        if path.name != "compile_marks.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Attribute, ast.Name))
        and "is_exporting" in (getattr(node, "attr", None), getattr(node, "id", None))
    ]
    assert direct == []
