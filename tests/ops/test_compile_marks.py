"""``constant_when_compiled`` marks a function exactly as ``torch.compiler.assume_constant_result`` does,
whether or not ``torch._dynamo`` is loaded yet."""

from __future__ import annotations

import sys

import torch

from inline_attn.ops import dispatch
from inline_attn.ops.compile_marks import constant_when_compiled
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
    for fn in (cpu.cpu_kernel_available, dispatch._triton_importable, dispatch._triton_interpreting):
        assert {k: getattr(fn, k, None) for k in mark} == mark, fn.__name__
