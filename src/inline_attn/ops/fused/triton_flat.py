"""The core's Triton kernels with flat arguments: what ``torch.compile`` launches.

The kernels of :mod:`.triton_kernels` and :mod:`.triton_stream` take each operand's strides and the
token grid as tuples (``q_st = (batch, token, channel)``, ``geo = (N, C, H, W, P, heads)``). Inductor
decides which tensors a user-defined kernel writes by reading its Triton IR, and that analysis
(torch 2.11 / 2.13 with triton 3.6 / 3.7) cannot follow tuple arguments: it then assumes every
tensor argument is written and clones q, k and v before each launch. Each kernel here takes the
same arguments with the tuples spelled out (strides as three integers, ``geo`` as six) and calls
the kernel it flattens, which Triton inlines: the compiled program is the same. Inductor types a
Python float argument fp64 on GPUs with fp64 (``_use_fp64_for_unbacked_floats``), and an fp64
``scale`` would make ``alpha`` and M fp64 (``tl.dot`` then refuses M beside an fp32 tile): each twin
hands its kernel ``scale`` as fp32, as a plain launch types it. The launchers send a launch here
only while a graph is traced (:func:`inline_attn.ops.fused.triton.flat_twin`).

TWINS maps each core kernel's name to its twin. The predictor's kernels have none: under
``torch.compile`` the predictor runs on aten ops that inductor fuses.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_kernels import (
    inline_bwd_fused,
    inline_bwd_partial,
    inline_bwd_resident,
    inline_bwd_rows,
    inline_fwd_fused,
    inline_fwd_partial,
    inline_fwd_resident,
    inline_fwd_rows,
)
from .triton_stream import inline_bwd_stream, inline_fwd_stream

# fmt: off
# One line per tuple argument: a stride triple (sample, token, channel), or geo's six integers.


@triton.jit
def inline_fwd_fused_flat(
    Q, K, V, W9, O,
    q0, q1, q2, k0, k1, k2, v0, v1, v2,
    n, c, h, w, p, heads, scale,
    D: tl.constexpr, BD: tl.constexpr, BLOCK_N: tl.constexpr, HAS_RES: tl.constexpr, PREC: tl.constexpr,
):
    inline_fwd_fused(
        Q, K, V, W9, O, (q0, q1, q2), (k0, k1, k2), (v0, v1, v2), (n, c, h, w, p, heads), tl.cast(scale, tl.float32),
        D, BD, BLOCK_N, HAS_RES, PREC,
    )


@triton.jit
def inline_fwd_resident_flat(
    Q, K, V, W9, O,
    q0, q1, q2, k0, k1, k2, v0, v1, v2,
    n, c, h, w, p, heads, scale,
    D: tl.constexpr, BD: tl.constexpr, NP: tl.constexpr, HAS_RES: tl.constexpr, PREC: tl.constexpr,
    SERIAL_TAPS: tl.constexpr,
):
    inline_fwd_resident(
        Q, K, V, W9, O, (q0, q1, q2), (k0, k1, k2), (v0, v1, v2), (n, c, h, w, p, heads), tl.cast(scale, tl.float32),
        D, BD, NP, HAS_RES, PREC, SERIAL_TAPS,
    )


@triton.jit
def inline_fwd_stream_flat(
    Q, K, V, W9, O,
    q0, q1, q2, k0, k1, k2, v0, v1, v2,
    n, c, h, w, p, heads, scale,
    D: tl.constexpr, BD: tl.constexpr, BLOCK_N: tl.constexpr, HAS_RES: tl.constexpr, NARROW: tl.constexpr,
    PREC: tl.constexpr,
):
    inline_fwd_stream(
        Q, K, V, W9, O, (q0, q1, q2), (k0, k1, k2), (v0, v1, v2), (n, c, h, w, p, heads), tl.cast(scale, tl.float32),
        D, BD, BLOCK_N, HAS_RES, NARROW, PREC,
    )


@triton.jit
def inline_bwd_fused_flat(
    Q, K, V, W9, G, DQ, DK, DV, DW,
    q0, q1, q2, k0, k1, k2, v0, v1, v2, g0, g1, g2,
    n, c, h, w, p, heads, scale,
    D: tl.constexpr, BD: tl.constexpr, BLOCK_N: tl.constexpr, HAS_RES: tl.constexpr, PREC: tl.constexpr,
):
    inline_bwd_fused(
        Q, K, V, W9, G, DQ, DK, DV, DW, (q0, q1, q2), (k0, k1, k2), (v0, v1, v2), (g0, g1, g2),
        (n, c, h, w, p, heads), tl.cast(scale, tl.float32), D, BD, BLOCK_N, HAS_RES, PREC,
    )


@triton.jit
def inline_bwd_resident_flat(
    Q, K, V, W9, G, DQ, DK, DV, DW,
    q0, q1, q2, k0, k1, k2, v0, v1, v2, g0, g1, g2,
    n, c, h, w, p, heads, scale,
    D: tl.constexpr, BD: tl.constexpr, NP: tl.constexpr, HAS_RES: tl.constexpr, PREC: tl.constexpr,
):
    inline_bwd_resident(
        Q, K, V, W9, G, DQ, DK, DV, DW, (q0, q1, q2), (k0, k1, k2), (v0, v1, v2), (g0, g1, g2),
        (n, c, h, w, p, heads), tl.cast(scale, tl.float32), D, BD, NP, HAS_RES, PREC,
    )


@triton.jit
def inline_bwd_stream_flat(
    Q, K, V, W9, G, DQ, DK, DV, DW,
    q0, q1, q2, k0, k1, k2, v0, v1, v2, g0, g1, g2,
    n, c, h, w, p, heads, scale,
    D: tl.constexpr, BD: tl.constexpr, BLOCK_N: tl.constexpr, HAS_RES: tl.constexpr, NARROW: tl.constexpr,
    PREC: tl.constexpr,
):
    inline_bwd_stream(
        Q, K, V, W9, G, DQ, DK, DV, DW, (q0, q1, q2), (k0, k1, k2), (v0, v1, v2), (g0, g1, g2),
        (n, c, h, w, p, heads), tl.cast(scale, tl.float32), D, BD, BLOCK_N, HAS_RES, NARROW, PREC,
    )


@triton.jit
def inline_fwd_partial_flat(
    K, V, WS,
    k0, k1, k2, v0, v1, v2,
    n, c, h, w, p, heads, chunk,
    D: tl.constexpr, BD: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
):
    inline_fwd_partial(K, V, WS, (k0, k1, k2), (v0, v1, v2), (n, c, h, w, p, heads), chunk, D, BD, BLOCK_N, PREC)


@triton.jit
def inline_fwd_rows_flat(
    Q, V, W9, O, WS,
    q0, q1, q2, v0, v1, v2,
    n, c, h, w, p, heads, chunk, SPLIT, rows, scale,
    D: tl.constexpr, BD: tl.constexpr, BLOCK_N: tl.constexpr, HAS_RES: tl.constexpr, PREC: tl.constexpr,
):
    inline_fwd_rows(
        Q, V, W9, O, WS, (q0, q1, q2), (v0, v1, v2), (n, c, h, w, p, heads), chunk, SPLIT, rows,
        tl.cast(scale, tl.float32), D, BD, BLOCK_N, HAS_RES, PREC,
    )


@triton.jit
def inline_bwd_partial_flat(
    Q, K, V, G, WS,
    q0, q1, q2, k0, k1, k2, v0, v1, v2, g0, g1, g2,
    n, c, h, w, p, heads, chunk,
    D: tl.constexpr, BD: tl.constexpr, BLOCK_N: tl.constexpr, HAS_RES: tl.constexpr, PREC: tl.constexpr,
):
    inline_bwd_partial(
        Q, K, V, G, WS, (q0, q1, q2), (k0, k1, k2), (v0, v1, v2), (g0, g1, g2), (n, c, h, w, p, heads), chunk,
        D, BD, BLOCK_N, HAS_RES, PREC,
    )


@triton.jit
def inline_bwd_rows_flat(
    K, V, W9, G, DQ, DK, DV, DW, WS,
    k0, k1, k2, v0, v1, v2, g0, g1, g2,
    n, c, h, w, p, heads, chunk, SPLIT, scale, rows,
    D: tl.constexpr, BD: tl.constexpr, BLOCK_N: tl.constexpr, HAS_RES: tl.constexpr, PREC: tl.constexpr,
):
    inline_bwd_rows(
        K, V, W9, G, DQ, DK, DV, DW, WS, (k0, k1, k2), (v0, v1, v2), (g0, g1, g2), (n, c, h, w, p, heads),
        chunk, SPLIT, tl.cast(scale, tl.float32), rows, D, BD, BLOCK_N, HAS_RES, PREC,
    )


# fmt: on

TWINS = {
    twin.fn.__name__.removesuffix("_flat"): twin
    for twin in (
        inline_fwd_fused_flat,
        inline_fwd_resident_flat,
        inline_fwd_stream_flat,
        inline_bwd_fused_flat,
        inline_bwd_resident_flat,
        inline_bwd_stream_flat,
        inline_fwd_partial_flat,
        inline_fwd_rows_flat,
        inline_bwd_partial_flat,
        inline_bwd_rows_flat,
    )
}
