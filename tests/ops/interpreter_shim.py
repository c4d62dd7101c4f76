"""Test-only: Triton's interpreter with correct bf16 products (triton#11584).

The interpreter keeps bf16 tensors as their raw 16-bit patterns (numpy has no bf16): its ``tl.dot``
multiplies those patterns as integers, and its fp32 -> bf16 cast truncates where a GPU rounds to
nearest even. Inside :func:`bf16_interpreter` both are done as on a GPU (the patterns decoded to
fp32, exactly, before the product; the cast rounded by torch), and the launchers pass bf16 / fp16
operands straight into ``tl.dot`` (``NARROW``) as they do on a GPU, so the interpreted tests run
the GPU's code path.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch


def _bf16_to_fp32(bits: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16).float().numpy()


def _fp32_to_bf16(values: np.ndarray) -> np.ndarray:
    rounded = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(torch.bfloat16)
    return rounded.view(torch.int16).numpy().view(np.uint16)


@contextlib.contextmanager
def bf16_interpreter():
    """Inside the block the interpreter multiplies and rounds bf16 as a GPU does, and the Triton
    launchers give the kernels bf16 / fp16 operands (their GPU path)."""
    import triton.language as tl
    from triton.runtime import interpreter

    from inline_attn.ops.fused import triton as launchers

    builder = interpreter.InterpreterBuilder
    create_dot, cast_impl = builder.create_dot, builder.cast_impl

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16:
            a = interpreter.TensorHandle(_bf16_to_fp32(a.data), tl.float32)
        if b.dtype.scalar == tl.bfloat16:
            b = interpreter.TensorHandle(_bf16_to_fp32(b.data), tl.float32)
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    def cast(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interpreter.TensorHandle(_fp32_to_bf16(src.data), tl.bfloat16)
        return cast_impl(self, src, dst_type)

    saved = launchers._state["narrow_interpreted"]
    builder.create_dot, builder.cast_impl = dot, cast
    launchers._state["narrow_interpreted"] = True
    try:
        yield
    finally:
        builder.create_dot, builder.cast_impl = create_dot, cast_impl
        launchers._state["narrow_interpreted"] = saved
