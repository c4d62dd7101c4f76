"""Test-only: Triton's interpreter with a GPU's 16-bit and tf32 products (triton#11584).

The interpreter keeps bf16 tensors as their raw 16-bit patterns (numpy has no bf16): its ``tl.dot``
multiplies those patterns as integers, and its fp32 -> bf16 cast truncates where a GPU rounds to
nearest even; it also multiplies fp32 operands exactly where a GPU's ``input_precision="tf32"``
product reads only their top 10 mantissa bits. Inside :func:`bf16_interpreter` all three are done
as on a GPU: bf16 and fp16 operands decoded to fp32 exactly (their products are exact, accumulated
in fp32), fp32 operands of a tf32 product truncated to tf32, every fp32 -> bf16 cast rounded to
nearest even by torch; and the launchers pass bf16 / fp16 operands straight into ``tl.dot``
(``NARROW``) as they do on a GPU, so the interpreted tests run the GPU's code path with its
roundings.
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


def _tf32_truncated(values: np.ndarray) -> np.ndarray:
    """fp32 values as a GPU's tf32 tensor-core product reads them: the low 13 of the 23 mantissa bits
    dropped (Triton passes fp32 registers to the tf32 instructions unrounded, triton#4574)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return bits.view(np.float32)


def _dot_operand(data: np.ndarray, dtype, tf32: bool) -> np.ndarray:
    """A tl.dot operand as fp32 values, as the GPU multiplies them: 16-bit floats exactly (their
    products are exact in the fp32 accumulation), fp32 truncated to tf32 where the dot asks for it."""
    import triton.language as tl

    if dtype == tl.bfloat16:
        return _bf16_to_fp32(data)
    if dtype == tl.float32:
        return _tf32_truncated(data) if tf32 else data
    return data.astype(np.float32)


@contextlib.contextmanager
def bf16_interpreter():
    """Inside the block the interpreter multiplies (bf16, fp16, tf32) and rounds (fp32 -> bf16) as a
    GPU does, and the Triton launchers give the kernels bf16 / fp16 operands (their GPU path)."""
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    from inline_attn.ops.fused import triton as launchers

    builder = interpreter.InterpreterBuilder
    create_dot, cast_impl = builder.create_dot, builder.cast_impl

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        tf32 = input_precision == ir.INPUT_PRECISION.TF32
        a = interpreter.TensorHandle(_dot_operand(a.data, a.dtype.scalar, tf32), tl.float32)
        b = interpreter.TensorHandle(_dot_operand(b.data, b.dtype.scalar, tf32), tl.float32)
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
