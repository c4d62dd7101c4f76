"""The streaming Triton kernels of the InLine layer core: one program per (sample, head) with few
live registers (paper Eq. 5 and Sec. 4.2, identity feature map; the notation of
:mod:`.triton_kernels`), run where ``core_kernels("stream")`` or the tuning table chooses them.

Each program streams over its tokens twice in tiles of BLOCK_N rows: a reduction loop (the d x d
products and the means), then a token loop (the outputs). Only the d x d accumulators, a few
per-row accumulators and the tiles in flight are live, so several programs share a multiprocessor,
where the resident launch of :mod:`.triton_kernels` holds a whole problem per program.

What bounds a program's time at these sizes is the chain of barriers it runs (every layout change
through shared memory and every reduction across warps is one or two), not its occupancy: the
programs of a layer fit in a few waves. So the sums over the tokens (key and value sums, the
residual's weight gradient) are kept per row through the loop and reduced across the warps once
after it, and the residual's taps are summed in their loads' layout and the product accumulated
into them (one layout change a tile instead of one per tap).

Precision. With ``NARROW`` (bf16 / fp16 inputs on a GPU) the tiles go into ``tl.dot`` in the
inputs' dtype, with fp32 accumulation:

- The sums multiply K as stored (exact operands) by V shifted by its token-0 row in fp32 and split
  into two operands, ``hi = (V - v_0) rounded`` and ``lo = (V - v_0 - hi) rounded`` (16 bits of
  each shifted value, where rounding it once would leave an error of 2^-9 of its size in every
  product, summed over the tokens into M); M is the fp32 correction of the sums,
  ``M = alpha (S - s_k s_v^T / N)`` with ``S = sum K^T (hi + lo)``, ``s_k = sum K`` and
  ``s_v = sum (hi + lo)``, the same values as the products so that the keys' mean cancels exactly
  but for the fp32 accumulation (relative error of M of the order of 2^-24 sqrt(N) times the keys'
  mean over their spread: 6e-4 at a mean 500x the spread over 3,136 tokens, below bf16's rounding
  of M).
- dK = alpha (V - v_bar) dM^T and dV = alpha (K - k_bar) dM take V and K centred on their means
  in fp32 and rounded once (no sum over the tokens carries that rounding: 1.2x eager bf16's error).
- The fp32 matrices a token loop multiplies by (M and dM) are split into two operands,
  ``hi = M rounded`` and ``lo = (M - hi) rounded``, and multiplied twice: 16 bits of M instead of
  8, for one more tensor-core product on a loop bounded by memory.

Without ``NARROW`` (fp32 inputs, or Triton's interpreter, whose bf16 ``tl.dot`` is wrong,
triton#11584) every operand is fp32, K and V shifted by their token-0 rows in the sums, and the
products use ``PREC``.

Neither kernel uses atomics: results are bit-reproducible run to run. Arguments as the fused
kernels of :mod:`.triton_kernels` (views with their strides, ``geo = (N, C, H, W, P, heads)``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_tiles import (
    add_taps,
    add_taps_grad_rows,
    broadcast_row,
    dense_view,
    grad_views,
    grid_cells,
    head_view,
    load_centred,
    load_row,
    load_tile_t,
    program_pair,
    row_block,
    store_taps_grad_rows,
    store_tile,
)


@triton.jit
def _operand(x, NARROW: tl.constexpr, OPS: tl.constexpr):
    """An fp32 tile as a tl.dot operand: in the inputs' dtype OPS with NARROW, else fp32."""
    if NARROW:
        x = x.to(OPS)
    return x


@triton.jit
def _load(view, n, mask, NARROW: tl.constexpr):
    """A [BLOCK_N, BD] tile of a view as a tl.dot operand: as stored with NARROW (no conversion,
    half the registers of fp32), else fp32."""
    ptr, sn, cols = view
    t = tl.load(ptr + n[:, None] * sn + cols[None, :], mask=mask, other=0.0)
    if not NARROW:
        t = t.to(tl.float32)
    return t


@triton.jit
def _hi_lo(m, NARROW: tl.constexpr, OPS: tl.constexpr):
    """An fp32 matrix as two operands whose sum is it to 16 bits (NARROW), or as itself (hi; lo unused)."""
    hi = m
    lo = m
    if NARROW:
        hi = m.to(OPS)
        lo = (m - hi.to(tl.float32)).to(OPS)
    return hi, lo


@triton.jit
def _times(a, hi, lo, NARROW: tl.constexpr, PREC: tl.constexpr, acc=None):
    """acc + a @ (hi + lo): two products with NARROW, one (hi is the fp32 matrix) without."""
    out = tl.dot(a, hi, acc, input_precision=PREC)
    if NARROW:
        out = tl.dot(a, lo, out, input_precision=PREC)
    return out


@triton.jit
def _stacked(a, b):
    """The [2 BLOCK_N, BD] tile of a's rows then b's (two [BLOCK_N, BD] tiles)."""
    return tl.reshape(tl.permute(tl.join(a, b), (2, 0, 1)), (2 * a.shape[0], a.shape[1]))


@triton.jit
def _key_shift(k, cmask, NARROW: tl.constexpr):
    """The row the keys are shifted by in the sums: token 0's in fp32, zero with NARROW (the key
    tiles go into tl.dot as stored, :func:`_sums_tile`)."""
    ck = load_row(k, 0, cmask)
    if NARROW:
        ck = tl.zeros_like(ck)
    return ck


@triton.jit
def _sums_tile(
    s, sk, sv, k, v, n, m2, ck, cv, NARROW: tl.constexpr, PREC: tl.constexpr, OPS: tl.constexpr, STACKED: tl.constexpr
):
    """One row tile's share of the reduction: s + (K - ck)^T (V - cv) and the sums of K - ck and V - cv.

    With NARROW (the module's "Precision") the key tile goes into tl.dot as stored and ck is zero;
    V - cv goes in as two 16-bit operands, hi + lo, and is summed as them. Rounded once to the
    operand dtype instead, each shifted value would be off by up to 2^-9 of itself, an error that
    the sum over the tokens carries into M: dQ = G M^T several times less accurate than eager
    bf16's, and more so with more tokens. ``STACKED``: one product of the stacked tiles,
    [K; K]^T [hi; lo], else two; which one compiles to fewer registers differs between the two
    kernels (ptxas for sm_90: the forward at head dim 64 in 80 stacked, 90 not; the backward at 32
    in 128 not stacked, 169 stacked). The sums are kept per row (sk, sv: [BLOCK_N, BD] tiles, reduced
    over their rows after the loop): no reduction across the warps, no barrier, per tile."""
    if NARROW:
        kt = _load(k, n, m2, NARROW)
        sk += kt.to(tl.float32)
        vh, vl = _hi_lo(load_centred(v, n, m2, cv), NARROW, OPS)
        sv += vh.to(tl.float32) + vl.to(tl.float32)
        if STACKED:
            s = tl.dot(tl.trans(_stacked(kt, kt)), _stacked(vh, vl), s, input_precision=PREC)
        else:
            s = _times(tl.trans(kt), vh, vl, NARROW, PREC, s)
    else:
        kt = load_centred(k, n, m2, ck)
        vt = load_centred(v, n, m2, cv)
        sk += kt
        sv += vt
        s = tl.dot(tl.trans(kt), vt, s, input_precision=PREC)
    return s, sk, sv


@triton.jit
def _stream_stats(
    k, v, cmask, ck, cv, N, BD: tl.constexpr, BLOCK_N: tl.constexpr, NARROW: tl.constexpr, PREC: tl.constexpr
):
    """The reduction over all tokens of K - ck and V - cv: (S, the key sums, the value sums)."""
    OPS: tl.constexpr = k[0].dtype.element_ty
    s = tl.zeros([BD, BD], dtype=tl.float32)
    sk = tl.zeros([BLOCK_N, BD], dtype=tl.float32)
    sv = tl.zeros([BLOCK_N, BD], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        n, m2 = row_block(start, N, cmask, BLOCK_N)
        s, sk, sv = _sums_tile(s, sk, sv, k, v, n, m2, ck, cv, NARROW, PREC, OPS, STACKED=True)
    return s, tl.sum(sk, axis=0), tl.sum(sv, axis=0)


@triton.jit
def inline_fwd_stream(
    Q,
    K,
    V,
    W9,
    O,
    q_st,
    k_st,
    v_st,
    geo,
    scale,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RES: tl.constexpr,
    NARROW: tl.constexpr,
    PREC: tl.constexpr,
):
    """One program per (sample, head): M = alpha (S - s_k s_v^T / N) streamed over the tokens,
    then O = Q M + v_bar + R(V, w) streamed over them again."""
    N, C, _, _, _, heads = geo
    OPS: tl.constexpr = Q.dtype.element_ty
    b, ch, cmask = program_pair(tl.program_id(0), heads, D, BD)
    k, v = head_view(K, k_st, b, ch), head_view(V, v_st, b, ch)
    cv = load_row(v, 0, cmask)
    s, sk, sv = _stream_stats(k, v, cmask, _key_shift(k, cmask, NARROW), cv, N, BD, BLOCK_N, NARROW, PREC)
    m_hi, m_lo = _hi_lo((s - sk[:, None] * (sv / N)[None, :]) * (scale / N), NARROW, OPS)
    vbar = cv + sv / N
    q, w9, o = head_view(Q, q_st, b, ch), dense_view(W9, b, 9, C, ch), dense_view(O, b, N, C, ch)
    for start in range(0, N, BLOCK_N):
        n, m2 = row_block(start, N, cmask, BLOCK_N)
        out = broadcast_row(vbar, BLOCK_N)
        if HAS_RES:
            out = add_taps(out, w9, v, cmask, grid_cells(n, N, geo), geo, 1)
        out = _times(_load(q, n, m2, NARROW), m_hi, m_lo, NARROW, PREC, out)
        store_tile(o, n, out, m2)


@triton.jit
def _stream_bwd_sums(
    q,
    k,
    v,
    g,
    cmask,
    ck,
    cv,
    geo,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RES: tl.constexpr,
    NARROW: tl.constexpr,
    PREC: tl.constexpr,
):
    """The backward's reduction over all tokens: the forward's sums (M is recomputed), dM = Q^T G,
    sum G and the residual's weight gradient dw[t] = sum_n G_n * V_{n+t}. The sums over the tokens
    are kept per row through the loop (the tuple dw of nine [BLOCK_N, BD] tiles) and reduced over
    their rows once after it."""
    N = geo[0]
    OPS: tl.constexpr = q[0].dtype.element_ty
    s = tl.zeros([BD, BD], dtype=tl.float32)
    dm = tl.zeros([BD, BD], dtype=tl.float32)
    sk = tl.zeros([BLOCK_N, BD], dtype=tl.float32)
    sv = tl.zeros([BLOCK_N, BD], dtype=tl.float32)
    gs = tl.zeros([BLOCK_N, BD], dtype=tl.float32)
    z = tl.zeros([BLOCK_N, BD], dtype=tl.float32)
    dw = (z, z, z, z, z, z, z, z, z)
    for start in range(0, N, BLOCK_N):
        n, m2 = row_block(start, N, cmask, BLOCK_N)
        s, sk, sv = _sums_tile(s, sk, sv, k, v, n, m2, ck, cv, NARROW, PREC, OPS, STACKED=False)
        gt = _load(g, n, m2, NARROW)
        dm = tl.dot(load_tile_t(q, n, m2, NARROW), gt, dm, input_precision=PREC)
        gf = gt.to(tl.float32)
        gs += gf
        if HAS_RES:
            dw = add_taps_grad_rows(dw, gf, v, cmask, grid_cells(n, N, geo), geo)
    return s, tl.sum(sk, axis=0), tl.sum(sv, axis=0), dm, tl.sum(gs, axis=0), dw


@triton.jit
def inline_bwd_stream(
    Q,
    K,
    V,
    W9,
    G,
    DQ,
    DK,
    DV,
    DW,
    q_st,
    k_st,
    v_st,
    g_st,
    geo,
    scale,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RES: tl.constexpr,
    NARROW: tl.constexpr,
    PREC: tl.constexpr,
):
    """One program per (sample, head): the reduction (M recomputed, dM, the means, dw), then
    dQ = G M^T, dK = alpha (V - v_bar) dM^T, dV = alpha (K - k_bar) dM + g_bar + R^T(G, w) streamed
    over the tokens again."""
    N, C, _, _, _, heads = geo
    OPS: tl.constexpr = Q.dtype.element_ty
    b, ch, cmask = program_pair(tl.program_id(0), heads, D, BD)
    q, k = head_view(Q, q_st, b, ch), head_view(K, k_st, b, ch)
    v, g = head_view(V, v_st, b, ch), head_view(G, g_st, b, ch)
    ck, cv = _key_shift(k, cmask, NARROW), load_row(v, 0, cmask)
    s, sk, sv, dm, gs, dw = _stream_bwd_sums(q, k, v, g, cmask, ck, cv, geo, BD, BLOCK_N, HAS_RES, NARROW, PREC)
    alpha = scale / N
    if HAS_RES:
        store_taps_grad_rows(DW, b, C, ch, cmask, dw)
    mt_hi, mt_lo = _hi_lo(tl.trans((s - sk[:, None] * (sv / N)[None, :]) * alpha), NARROW, OPS)
    dm_hi, dm_lo = _hi_lo(dm * alpha, NARROW, OPS)
    dmt_hi, dmt_lo = _hi_lo(tl.trans(dm) * alpha, NARROW, OPS)
    gbar = gs / N
    dq_out, dk_out, dv_out = grad_views(DQ, DK, DV, b, N, C, ch)
    w9 = dense_view(W9, b, 9, C, ch)
    for start in range(0, N, BLOCK_N):
        n, m2 = row_block(start, N, cmask, BLOCK_N)
        # the rows' offsets once for the three stores (with store_tile the kernel compiles to
        # the same instructions in another order); each gradient is stored as soon as it is
        # computed: fewer tiles live at once (registers)
        rows = n[:, None] * C
        dq = _times(_load(g, n, m2, NARROW), mt_hi, mt_lo, NARROW, PREC)
        tl.store(dq_out[0] + rows + dq_out[2][None, :], dq.to(DQ.dtype.element_ty), mask=m2)
        vc = _operand(load_centred(v, n, m2, cv, sv / N), NARROW, OPS)
        dk = _times(vc, dmt_hi, dmt_lo, NARROW, PREC)
        tl.store(dk_out[0] + rows + dk_out[2][None, :], dk.to(DK.dtype.element_ty), mask=m2)
        dv = broadcast_row(gbar, BLOCK_N)
        if HAS_RES:
            dv = add_taps(dv, w9, g, cmask, grid_cells(n, N, geo), geo, -1)
        kc = _operand(load_centred(k, n, m2, ck, sk / N), NARROW, OPS)
        dv = _times(kc, dm_hi, dm_lo, NARROW, PREC, dv)
        tl.store(dv_out[0] + rows + dv_out[2][None, :], dv.to(DV.dtype.element_ty), mask=m2)
