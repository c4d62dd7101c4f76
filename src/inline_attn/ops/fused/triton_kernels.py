"""Triton kernels of the InLine layer core: forward and backward, all heads, prefix tokens and the
predicted 3x3 local residual (paper Eq. 5 and Sec. 4.2, identity feature map).

Launched by :mod:`inline_attn.ops.fused.triton` (compiled for CUDA tensors, run by Triton's
interpreter for CPU tensors). Per sample b and head h (d channels ``[h*d, (h+1)*d)``), with
``alpha = scale / N``:

    forward    M = alpha (K - k_bar)^T (V - v_bar)   (d x d, fp32)
               O = Q M + v_bar + R(V, w)             (R: 3x3 depthwise conv on grid tokens)
    backward   dM = Q^T G,  dQ = G M^T,  dK = alpha (V - v_bar) dM^T,
               dV = alpha (K - k_bar) dM + mean(G) + R^T(G, w),  dw[t] = sum_n G_n * V_{n+t}

Each pass is a reduction over the tokens (the d x d products, the means, the residual's weight
gradient) followed by a token-parallel pass. In the tiled launches (fused and split, below) the
centred product is accumulated in one pass, tile by tile, with the pairwise update of Chan, Golub
and LeVeque (1979): each tile's product is centred on the tile's own means and merged with a
rank-1 correction, so no sum carries the ``N k_bar v_bar^T`` term whose cancellation would cost
digits at large N. Keys and values are first shifted by their token-0 row, so the means the merge
subtracts are of the spread's size even when the activations' mean is far from zero.

Three launch shapes:

- ``resident``: one program per (sample, head) holds the whole problem as single [NP, BD] tiles
  (NP >= N; up to 256 tokens at head dim 32, 128 at 64): each operand is read once, K and V are
  centred on their exact means (two passes over registers), and there is no loop over tokens.
  Used wherever it fits: DeiT's 197 tokens, Swin's windows of 7 and 14, the hierarchical models'
  later stages.
- ``fused``: one program per (sample, head) does the reduction and then the token pass, both in
  tiles of BLOCK_N rows (the second read of V / K / G mostly hits L2). Used for longer sequences
  when the (sample, head) pairs fill the GPU.
- ``split``: the reduction is split over token chunks (``*_partial``), and the token pass runs
  over row blocks (``*_rows``), each program merging its pair's chunks in a fixed order first: two
  launches a direction. Used when there are few pairs and many tokens.

Neither uses atomics: results are bit-reproducible run to run. All sums are fp32.

Layouts: q, k, v (and the upstream gradient g) are [B, N, C] with any strides (views into a qkv
projection are read in place), each passed with its strides as one tuple ``(batch, token,
channel)``; w9 is [B, 9, C] contiguous (tap ``t = 3 * (dy + 1) + (dx + 1)``); outputs are
[B, N, C] contiguous. ``geo = (N, C, H, W, P, heads)``: tokens ``[0, P)`` are prefix tokens
(attended to, no residual); token ``P + y * W + x`` is grid cell (y, x). Inside the kernels an
operand is a *view* of one (sample, head) (:mod:`.triton_tiles`, whose tile helpers both kernel
modules call).

Workspace rows (fp32, one per (sample, head) and chunk): forward ``[S (BD*BD), k_mean, v_mean]``,
backward ``[S, dM (BD*BD each), k_mean, v_mean, g_sum, dw (16 rows of BD)]``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_tiles import (
    add_taps,
    add_taps_grad,
    broadcast_row,
    dense_view,
    grad_views,
    grid_cells,
    head_view,
    load_centred,
    load_row,
    load_tile,
    load_tile_t,
    program_pair,
    row_block,
    store_taps_grad,
    store_tile,
    taps_grad,
    warp_sums,
)


@triton.jit
def _no_stats(BD: tl.constexpr):
    """The centred statistics of no tokens: (count, key means, value means, S)."""
    return 0.0, tl.zeros([BD], dtype=tl.float32), tl.zeros([BD], dtype=tl.float32), tl.zeros([BD, BD], dtype=tl.float32)


@triton.jit
def _no_bwd_sums(BD: tl.constexpr):
    """The backward sums of no tokens: the statistics, dM, sum G and dw ([16, BD])."""
    cnt, mk, mv, s = _no_stats(BD)
    dm = tl.zeros([BD, BD], dtype=tl.float32)
    gs = tl.zeros([BD], dtype=tl.float32)
    dw = tl.zeros([16, BD], dtype=tl.float32)
    return cnt, mk, mv, s, dm, gs, dw


@triton.jit
def _merge(cnt, mk, mv, s, cnt_b, mk_b, mv_b, s_b):
    """Merge centred statistics (count, means, sum of centred products) of two token sets."""
    tot = cnt + cnt_b
    f = cnt_b / tot
    dk = mk_b - mk
    dv = mv_b - mv
    return tot, mk + dk * f, mv + dv * f, s + s_b + (cnt * f) * dk[:, None] * dv[None, :]


@triton.jit
def _tile_stats(kt, vt, m2, n_valid):
    """A tile's count, column means and centred product K_c^T V_c (fp32 tiles, masked rows 0)."""
    mk = tl.sum(kt, axis=0) / n_valid
    mv = tl.sum(vt, axis=0) / n_valid
    kc = tl.where(m2, kt - mk[None, :], 0.0)
    vc = tl.where(m2, vt - mv[None, :], 0.0)
    return mk, mv, kc, vc


@triton.jit
def _add_tile(cnt, mk, mv, s, k, v, n, m2, ck, cv, n_valid, PREC: tl.constexpr):
    """Merge the tile of rows n (mask m2, n_valid rows) of K - ck and V - cv into the statistics."""
    kt = load_centred(k, n, m2, ck)
    vt = load_centred(v, n, m2, cv)
    tmk, tmv, kc, vc = _tile_stats(kt, vt, m2, n_valid)
    return _merge(cnt, mk, mv, s, n_valid, tmk, tmv, tl.dot(tl.trans(kc), vc, input_precision=PREC))


@triton.jit
def _fwd_sums(k, v, cmask, ck, cv, n_lo, n_hi, BD: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    """Centred statistics of tokens [n_lo, n_hi): means of K - ck and V - cv, S = sum K_c^T V_c."""
    cnt, mk, mv, s = _no_stats(BD)
    for start in range(n_lo, n_hi, BLOCK_N):
        n, m2 = row_block(start, n_hi, cmask, BLOCK_N)
        n_valid = tl.minimum(n_hi - start, BLOCK_N).to(tl.float32)
        cnt, mk, mv, s = _add_tile(cnt, mk, mv, s, k, v, n, m2, ck, cv, n_valid, PREC)
    return cnt, mk, mv, s


@triton.jit
def _fwd_rows(
    q, v, w9, o, cmask, m, vbar, n0, n1, geo, HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr
):
    """O rows [n0, n1) = Q M + v_bar (+ the 3x3 residual on grid rows)."""
    for start in range(n0, n1, BLOCK_N):
        n, m2 = row_block(start, n1, cmask, BLOCK_N)
        out = broadcast_row(vbar, BLOCK_N)
        if HAS_RES:
            out = add_taps(out, w9, v, cmask, grid_cells(n, n1, geo), geo, 1)
        out = tl.dot(load_tile(q, n, m2), m, out, input_precision=PREC)
        store_tile(o, n, out, m2)


@triton.jit
def _square(BD: tl.constexpr):
    """Offsets of a BD vector and of a row-major BD x BD matrix (workspace rows)."""
    c = tl.arange(0, BD)
    return c, c[:, None] * BD + c[None, :]


@triton.jit
def inline_fwd_fused(
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
    PREC: tl.constexpr,
):
    """One program per (sample, head): the statistics, M, then every output row of that head."""
    N, C, _, _, _, heads = geo
    b, ch, cmask = program_pair(tl.program_id(0), heads, D, BD)
    k, v = head_view(K, k_st, b, ch), head_view(V, v_st, b, ch)
    cv = load_row(v, 0, cmask)
    cnt, mk, mv, s = _fwd_sums(k, v, cmask, load_row(k, 0, cmask), cv, 0, N, BD, BLOCK_N, PREC)
    q, w9, o = head_view(Q, q_st, b, ch), dense_view(W9, b, 9, C, ch), dense_view(O, b, N, C, ch)
    _fwd_rows(q, v, w9, o, cmask, s * (scale / N), cv + mv, 0, N, geo, HAS_RES, BLOCK_N, PREC)


@triton.jit
def inline_fwd_partial(
    K, V, WS, k_st, v_st, geo, chunk, D: tl.constexpr, BD: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr
):
    """Program (sample*head, chunk): centred statistics of one token chunk -> its workspace row."""
    N, _, _, _, _, heads = geo
    pid = tl.program_id(0)
    b, ch, cmask = program_pair(pid, heads, D, BD)
    n_lo = tl.program_id(1) * chunk
    k, v = head_view(K, k_st, b, ch), head_view(V, v_st, b, ch)
    ck, cv = load_row(k, 0, cmask), load_row(v, 0, cmask)
    cnt, mk, mv, s = _fwd_sums(k, v, cmask, ck, cv, n_lo, tl.minimum(n_lo + chunk, N), BD, BLOCK_N, PREC)
    c, sq = _square(BD)
    ws = WS + (pid * tl.num_programs(1) + tl.program_id(1)) * (BD * BD + 2 * BD)
    tl.store(ws + sq, s)
    tl.store(ws + BD * BD + c, mk)
    tl.store(ws + BD * BD + BD + c, mv)


@triton.jit
def _merged_stats(WS, pid, SPLIT, chunk, N, row, vec, BD: tl.constexpr):
    """The SPLIT chunk rows of one (sample, head) merged in chunk order: (key means, value means,
    S) of the shifted K and V; ``row``: a workspace row's length, ``vec``: where its means begin."""
    c, sq = _square(BD)
    cnt, mk, mv, s = _no_stats(BD)
    for i in range(0, SPLIT):
        ws = WS + (pid * SPLIT + i) * row
        n_i = tl.minimum(chunk, N - i * chunk).to(tl.float32)
        cnt, mk, mv, s = _merge(
            cnt, mk, mv, s, n_i, tl.load(ws + vec + c), tl.load(ws + vec + BD + c), tl.load(ws + sq)
        )
    return mk, mv, s


@triton.jit
def inline_fwd_rows(
    Q,
    V,
    W9,
    O,
    WS,
    q_st,
    v_st,
    geo,
    chunk,
    SPLIT,
    rows,
    scale,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RES: tl.constexpr,
    PREC: tl.constexpr,
):
    """Program (sample*head, row block): its pair's chunk rows merged in chunk order (every row block
    of a pair the same way: the same M), then output rows [i*rows, (i+1)*rows)."""
    N, C, _, _, _, heads = geo
    pid = tl.program_id(0)
    b, ch, cmask = program_pair(pid, heads, D, BD)
    mk, mv, s = _merged_stats(WS, pid, SPLIT, chunk, N, BD * BD + 2 * BD, BD * BD, BD)
    n0 = tl.program_id(1) * rows
    q, v = head_view(Q, q_st, b, ch), head_view(V, v_st, b, ch)
    w9, o = dense_view(W9, b, 9, C, ch), dense_view(O, b, N, C, ch)
    vbar = load_row(v, 0, cmask) + mv
    _fwd_rows(q, v, w9, o, cmask, s * (scale / N), vbar, n0, tl.minimum(n0 + rows, N), geo, HAS_RES, BLOCK_N, PREC)


@triton.jit
def _bwd_sums(
    q,
    k,
    v,
    g,
    cmask,
    ck,
    cv,
    n_lo,
    n_hi,
    geo,
    HAS_RES: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREC: tl.constexpr,
):
    """Over tokens [n_lo, n_hi): the forward's statistics (M is recomputed), dM = Q^T G, sum G and
    the residual's weight gradient dw[t] = sum_n G_n * V_{n+t} ([16, BD], rows 0..8 used)."""
    cnt, mk, mv, s, dm, gs, dw = _no_bwd_sums(BD)
    taps = tl.arange(0, 16)
    for start in range(n_lo, n_hi, BLOCK_N):
        n, m2 = row_block(start, n_hi, cmask, BLOCK_N)
        n_valid = tl.minimum(n_hi - start, BLOCK_N).to(tl.float32)
        cnt, mk, mv, s = _add_tile(cnt, mk, mv, s, k, v, n, m2, ck, cv, n_valid, PREC)
        gt = load_tile(g, n, m2)
        dm += tl.dot(load_tile_t(q, n, m2), gt, input_precision=PREC)
        gs += tl.sum(gt, axis=0)
        if HAS_RES:
            dw = add_taps_grad(dw, taps, gt, v, cmask, grid_cells(n, n_hi, geo), geo)
    return cnt, mk, mv, s, dm, gs, dw


@triton.jit
def _bwd_rows(
    g,
    k,
    v,
    w9,
    grads,
    cmask,
    m,
    adm,
    ck,
    mk,
    cv,
    mv,
    gbar,
    n0,
    n1,
    geo,
    HAS_RES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREC: tl.constexpr,
):
    """dQ, dK, dV rows [n0, n1) (grads: their views) from M, alpha dM (adm), the rows K and V are
    shifted by (ck, cv: token 0's) and the shifted rows' means (mk, mv)."""
    dq_out, dk_out, dv_out = grads
    for start in range(n0, n1, BLOCK_N):
        n, m2 = row_block(start, n1, cmask, BLOCK_N)
        # each gradient is stored as soon as it is computed: fewer tiles live at once (registers)
        store_tile(dq_out, n, tl.dot(load_tile(g, n, m2), tl.trans(m), input_precision=PREC), m2)
        vc = load_centred(v, n, m2, cv, mv)
        store_tile(dk_out, n, tl.dot(vc, tl.trans(adm), input_precision=PREC), m2)
        dv = broadcast_row(gbar, BLOCK_N)
        if HAS_RES:
            dv = add_taps(dv, w9, g, cmask, grid_cells(n, n1, geo), geo, -1)
        kc = load_centred(k, n, m2, ck, mk)
        store_tile(dv_out, n, tl.dot(kc, adm, dv, input_precision=PREC), m2)


@triton.jit
def inline_bwd_fused(
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
    PREC: tl.constexpr,
):
    """One program per (sample, head): the backward sums, then every gradient row of that head."""
    N, C, _, _, _, heads = geo
    b, ch, cmask = program_pair(tl.program_id(0), heads, D, BD)
    q, k = head_view(Q, q_st, b, ch), head_view(K, k_st, b, ch)
    v, g = head_view(V, v_st, b, ch), head_view(G, g_st, b, ch)
    ck, cv = load_row(k, 0, cmask), load_row(v, 0, cmask)
    cnt, mk, mv, s, dm, gs, dw = _bwd_sums(q, k, v, g, cmask, ck, cv, 0, N, geo, HAS_RES, BD, BLOCK_N, PREC)
    alpha = scale / N
    if HAS_RES:
        store_taps_grad(DW, b, C, ch, cmask, dw)
    grads = grad_views(DQ, DK, DV, b, N, C, ch)
    w9 = dense_view(W9, b, 9, C, ch)
    _bwd_rows(
        g, k, v, w9, grads, cmask, s * alpha, dm * alpha, ck, mk, cv, mv, gs / N, 0, N, geo, HAS_RES, BLOCK_N, PREC
    )


@triton.jit
def inline_bwd_partial(
    Q,
    K,
    V,
    G,
    WS,
    q_st,
    k_st,
    v_st,
    g_st,
    geo,
    chunk,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RES: tl.constexpr,
    PREC: tl.constexpr,
):
    """Program (sample*head, chunk): the backward sums over one token chunk -> its workspace row."""
    N, _, _, _, _, heads = geo
    pid = tl.program_id(0)
    b, ch, cmask = program_pair(pid, heads, D, BD)
    n_lo = tl.program_id(1) * chunk
    n_hi = tl.minimum(n_lo + chunk, N)
    q, k = head_view(Q, q_st, b, ch), head_view(K, k_st, b, ch)
    v, g = head_view(V, v_st, b, ch), head_view(G, g_st, b, ch)
    ck, cv = load_row(k, 0, cmask), load_row(v, 0, cmask)
    cnt, mk, mv, s, dm, gs, dw = _bwd_sums(q, k, v, g, cmask, ck, cv, n_lo, n_hi, geo, HAS_RES, BD, BLOCK_N, PREC)
    c, sq = _square(BD)
    ws = WS + (pid * tl.num_programs(1) + tl.program_id(1)) * (2 * BD * BD + 19 * BD)
    tl.store(ws + sq, s)
    tl.store(ws + BD * BD + sq, dm)
    vec = ws + 2 * BD * BD
    tl.store(vec + c, mk)
    tl.store(vec + BD + c, mv)
    tl.store(vec + 2 * BD + c, gs)
    taps = tl.arange(0, 16)
    tl.store(vec + 3 * BD + taps[:, None] * BD + c[None, :], dw)


@triton.jit
def inline_bwd_rows(
    K,
    V,
    W9,
    G,
    DQ,
    DK,
    DV,
    DW,
    WS,
    k_st,
    v_st,
    g_st,
    geo,
    chunk,
    SPLIT,
    scale,
    rows,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RES: tl.constexpr,
    PREC: tl.constexpr,
):
    """Program (sample*head, row block): its pair's chunk rows merged in chunk order (M, dM, the
    means; row block 0 also writes the residual's weight gradient), then gradient rows
    [i*rows, (i+1)*rows)."""
    N, C, _, _, _, heads = geo
    pid = tl.program_id(0)
    b, ch, cmask = program_pair(pid, heads, D, BD)
    c, sq = _square(BD)
    row = 2 * BD * BD + 19 * BD
    mk, mv, s = _merged_stats(WS, pid, SPLIT, chunk, N, row, 2 * BD * BD, BD)
    dm = tl.zeros([BD, BD], dtype=tl.float32)
    gs = tl.zeros([BD], dtype=tl.float32)
    for i in range(0, SPLIT):
        ws = WS + (pid * SPLIT + i) * row
        dm += tl.load(ws + BD * BD + sq)
        gs += tl.load(ws + 2 * BD * BD + 2 * BD + c)
    if HAS_RES:
        if tl.program_id(1) == 0:
            taps = tl.arange(0, 16)
            dw = tl.zeros([16, BD], dtype=tl.float32)
            for i in range(0, SPLIT):
                dw += tl.load(WS + (pid * SPLIT + i) * row + 2 * BD * BD + 3 * BD + taps[:, None] * BD + c[None, :])
            store_taps_grad(DW, b, C, ch, cmask, dw)
    n0 = tl.program_id(1) * rows
    k, v, g = head_view(K, k_st, b, ch), head_view(V, v_st, b, ch), head_view(G, g_st, b, ch)
    ck, cv = load_row(k, 0, cmask), load_row(v, 0, cmask)
    grads, w9 = grad_views(DQ, DK, DV, b, N, C, ch), dense_view(W9, b, 9, C, ch)
    n1 = tl.minimum(n0 + rows, N)
    alpha = scale / N
    _bwd_rows(
        g, k, v, w9, grads, cmask, s * alpha, dm * alpha, ck, mk, cv, mv, gs / N, n0, n1, geo, HAS_RES, BLOCK_N, PREC
    )


# The resident launch: when one (sample, head) problem fits a program's registers (N up to 256 at
# head dim 32, 128 at 64), the program loads K and V once, and Q (forward) or Q and G (backward)
# once, as single [NP, BD] tiles (NP >= N), centres K and V on their means, and does the
# core, the residual and its taps' gradients with no loop over tokens and no second read of an
# operand from memory (the taps' shifted rows come from the cache).


@triton.jit
def _centred(k, v, n, m2, cmask, N, SHIFT: tl.constexpr):
    """The [NP, BD] tiles of K and V at rows n, centred on their means (rows past N zero), and the
    value means (v_bar).

    With SHIFT each is shifted by its token-0 row before the means are taken and the shifted rows'
    mean subtracted after (:func:`load_centred`), so that every centred row is exact to its
    own rounding: the backward's dK = alpha Vc dM^T and dV = alpha Kc dM need it. Centred on the
    float32 means of K and V themselves, every row moves alike by the means' rounding, which the
    forward's M = alpha Kc^T Vc keeps only in a product of two such errors (the centred rows' sum
    cancels the rest) and v_bar to its own rounding; the forward skips the shift (at Swin's 7x7
    windows its two rows cost 24 registers on sm_90, 8 -> 6 programs a multiprocessor)."""
    if SHIFT:
        ck, cv = load_row(k, 0, cmask), load_row(v, 0, cmask)
        kt = load_centred(k, n, m2, ck)
        vt = load_centred(v, n, m2, cv)
    else:
        kt = load_tile(k, n, m2)
        vt = load_tile(v, n, m2)
    # both means summed per warp, then across warps together: one cross-warp reduction, not two
    BITS: tl.constexpr = v[0].dtype.element_ty.primitive_bitwidth  # a K of another width: a layout change, same sums
    mk, mv = tl.split(tl.sum(tl.join(warp_sums(kt, BITS), warp_sums(vt, BITS)), axis=0) / N)
    kc = tl.where(m2, kt - mk[None, :], 0.0)
    vc = tl.where(m2, vt - mv[None, :], 0.0)
    if SHIFT:
        mv += cv
    return kc, vc, mv


@triton.jit
def inline_fwd_resident(
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
    NP: tl.constexpr,
    HAS_RES: tl.constexpr,
    PREC: tl.constexpr,
    SERIAL_TAPS: tl.constexpr,
):
    """One program per (sample, head), every operand read once: M = alpha Kc^T Vc, then
    O = Q M + v_bar + R(V, w); SERIAL_TAPS: the residual's taps one at a time (:func:`add_taps`,
    the launcher's choice)."""
    N, C, _, _, _, heads = geo
    b, ch, cmask = program_pair(tl.program_id(0), heads, D, BD)
    n, m2 = row_block(0, N, cmask, NP)
    v = head_view(V, v_st, b, ch)
    kc, vc, vbar = _centred(head_view(K, k_st, b, ch), v, n, m2, cmask, N, False)
    m = tl.dot(tl.trans(kc), vc, input_precision=PREC) * (scale / N)
    out = broadcast_row(vbar, NP)
    if HAS_RES:
        w9 = dense_view(W9, b, 9, C, ch)
        out = add_taps(out, w9, v, cmask, grid_cells(n, N, geo), geo, 1, SERIAL_TAPS)
    out = tl.dot(load_tile(head_view(Q, q_st, b, ch), n, m2), m, out, input_precision=PREC)
    store_tile(dense_view(O, b, N, C, ch), n, out, m2)


@triton.jit
def inline_bwd_resident(
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
    NP: tl.constexpr,
    HAS_RES: tl.constexpr,
    PREC: tl.constexpr,
):
    """One program per (sample, head), every operand read once: M recomputed, dM = Q^T G, then
    dQ = G M^T, dK = alpha Vc dM^T, dV = alpha Kc dM + g_bar + R^T(G, w), and dw."""
    N, C, _, _, _, heads = geo
    b, ch, cmask = program_pair(tl.program_id(0), heads, D, BD)
    n, m2 = row_block(0, N, cmask, NP)
    alpha = scale / N
    v, g = head_view(V, v_st, b, ch), head_view(G, g_st, b, ch)
    kc, vc, _ = _centred(head_view(K, k_st, b, ch), v, n, m2, cmask, N, True)
    m = tl.dot(tl.trans(kc), vc, input_precision=PREC) * alpha
    gt = load_tile(g, n, m2)
    adm = tl.dot(load_tile_t(head_view(Q, q_st, b, ch), n, m2), gt, input_precision=PREC) * alpha
    dq_out, dk_out, dv_out = grad_views(DQ, DK, DV, b, N, C, ch)
    # each gradient is stored as soon as it is computed: fewer tiles live at once (registers)
    store_tile(dq_out, n, tl.dot(gt, tl.trans(m), input_precision=PREC), m2)
    store_tile(dk_out, n, tl.dot(vc, tl.trans(adm), input_precision=PREC), m2)
    dv = broadcast_row(tl.sum(gt, axis=0) / N, NP)
    if HAS_RES:
        cells = grid_cells(n, N, geo)
        dv = add_taps(dv, dense_view(W9, b, 9, C, ch), g, cmask, cells, geo, -1)
        store_taps_grad(DW, b, C, ch, cmask, taps_grad(gt, v, cmask, cells, geo))
    store_tile(dv_out, n, tl.dot(kc, adm, dv, input_precision=PREC), m2)


# The residual predictor (paper Sec. 4.2): per sample b and head h (the predictor's groups are the
# heads), with x the layer input and d channels ``ch = [h*d, (h+1)*d)``:
#
#     forward    ctx = mean_n x[b, n, ch];  y1 = W1_h ctx + b1;  a = GELU(y1)
#                taps[t] = W2_{h,t} a + b2_t       (W2_{h,t}[j, i] = W2[9 * ch_j + t, i], t < 9)
#     backward   da = sum_t W2_{h,t}^T dtaps[t];  dy1 = da * GELU'(y1);  dctx = W1_h^T dy1 / N
#                dW1_h = sum_b dy1 ctx^T,  dW2_{h,t} = sum_b dtaps[t] a^T  (and the biases' sums)
#
# W1 is [C, d] and W2 [9C, d] (the grouped 1x1 convolutions' weights, contiguous); everything in fp32.

# constexpr: a jit function may read a module global only when it is one (a plain float fails to compile)
_SQRT1_2 = tl.constexpr(0.7071067811865476)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)


@triton.jit
def _gelu(y):
    """Exact GELU (``nn.GELU()``): y * Phi(y)."""
    return 0.5 * y * (1.0 + tl.math.erf(y * _SQRT1_2))


@triton.jit
def _gelu_grad(y):
    """d GELU / dy = Phi(y) + y * phi(y)."""
    return 0.5 * (1.0 + tl.math.erf(y * _SQRT1_2)) + y * tl.exp(-0.5 * y * y) * _INV_SQRT_2PI


@triton.jit
def _head_block(ptr, rows, cols, cmask):
    """A [BD, BD] fp32 block: rows given as row offsets, columns as column indices (both masked by cmask)."""
    return tl.load(ptr + rows[:, None] + cols[None, :], mask=cmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)


@triton.jit
def predictor_fwd(
    X,
    W1,
    B1,
    W2,
    B2,
    CTX,
    TAPS,
    x_st,
    B,
    N,
    C,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PREC: tl.constexpr,
):
    """Programs (head, block of BLOCK_B samples): the token means of x over the head's channels,
    then the head's two products and the GELU for the whole block, the head's weights read once;
    writes ctx [B, C] and the taps [B, 9, C] (fp32).

    The token loop adds each [BLOCK_B, BLOCK_T, BD] tile of x into an fp32 tile of the same shape,
    element by element, and sums that over its tokens once after the loop: no reduction and no
    barrier in the loop, each iteration's loads in flight together (the launcher sizes the tile,
    :func:`~inline_attn.ops.fused.triton._predictor_tokens`). Summed over tokens in the loop, or
    pipelined through shared memory, every iteration cost two barriers (25 iterations at DeiT-T's
    197 tokens: 76 barriers a program, against 29)."""
    head = tl.program_id(0)
    i = tl.arange(0, BD)
    ch = head * D + i
    cmask = i < D
    rb = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    m2 = (rb < B)[:, None] & cmask[None, :]
    tok = tl.arange(0, BLOCK_T)
    rows = X + rb[:, None, None].to(tl.int64) * x_st[0] + ch[None, None, :] * x_st[2]
    acc = tl.zeros([BLOCK_B, BLOCK_T, BD], dtype=tl.float32)
    for start in range(0, N, BLOCK_T):
        t = start + tok
        m3 = m2[:, None, :] & (t < N)[None, :, None]
        acc += tl.load(rows + t[None, :, None] * x_st[1], mask=m3, other=0.0).to(tl.float32)
    ctx = tl.sum(acc, axis=1) / N
    tl.store(CTX + rb[:, None] * C + ch[None, :], ctx, mask=m2)
    w1 = _head_block(W1, ch * D, i, cmask)  # [j, i]
    b1 = tl.load(B1 + ch, mask=cmask, other=0.0).to(tl.float32)
    a = _gelu(tl.dot(ctx, tl.trans(w1), input_precision=PREC) + b1[None, :])
    for t in range(9):
        w2 = _head_block(W2, (9 * ch + t) * D, i, cmask)
        b2 = tl.load(B2 + 9 * ch + t, mask=cmask, other=0.0).to(tl.float32)
        tap = tl.dot(a, tl.trans(w2), input_precision=PREC) + b2[None, :]
        tl.store(TAPS + rb[:, None] * 9 * C + t * C + ch[None, :], tap, mask=m2)


@triton.jit
def _out_rows(head, slot, j, D: tl.constexpr):
    """The gradient rows of a head's rows j for one slot: slot 0 is W1 (row ``h*d + j`` of W1
    and b1), slot 1 + t is tap t of W2 (row ``9 * (h*d + j) + t`` of W2 and b2)."""
    row = head * D + j
    return tl.where(slot == 0, row, 9 * row + slot - 1)


@triton.jit
def _store_slot(DW1, DB1, DW2, DB2, head, slot, mat, vec, D: tl.constexpr, BD: tl.constexpr):
    """Store one (head, slot) gradient: mat [BD, BD] ([j, i]) into W1's or W2's gradient, vec [BD]
    (over j) into the matching bias gradient."""
    j = tl.arange(0, BD)
    cmask = j < D
    rows = _out_rows(head, slot, j, D)
    m2 = cmask[:, None] & cmask[None, :]
    if slot == 0:
        tl.store(DW1 + rows[:, None] * D + j[None, :], mat, mask=m2)
        tl.store(DB1 + rows, vec, mask=cmask)
    else:
        tl.store(DW2 + rows[:, None] * D + j[None, :], mat, mask=m2)
        tl.store(DB2 + rows, vec, mask=cmask)


@triton.jit
def _slot_sums(CTX, DTAPS, W2, DCTX, w1, b1, rb, ch, i, cmask, slot, B, N, C, D: tl.constexpr, PREC: tl.constexpr):
    """One block of samples' share of a slot's gradient ([BD, BD], [j, i]) and of its bias (over j);
    slot 0 also stores the block's dctx / N."""
    m2 = (rb < B)[:, None] & cmask[None, :]
    ctx = tl.load(CTX + rb[:, None] * C + ch[None, :], mask=m2, other=0.0)
    y1 = tl.dot(ctx, tl.trans(w1), input_precision=PREC) + b1[None, :]
    if slot == 0:
        da = tl.zeros_like(ctx)
        for t in range(9):
            g = tl.load(DTAPS + rb[:, None] * 9 * C + t * C + ch[None, :], mask=m2, other=0.0)
            da += tl.dot(g, _head_block(W2, (9 * ch + t) * D, i, cmask), input_precision=PREC)
        dy1 = da * _gelu_grad(y1)  # zero on padded samples: their dtaps were loaded as zeros
        tl.store(DCTX + rb[:, None] * C + ch[None, :], tl.dot(dy1, w1, input_precision=PREC) / N, mask=m2)
        mat = tl.dot(tl.trans(dy1), ctx, input_precision=PREC)
        vec = tl.sum(dy1, axis=0)
    else:
        a = tl.where(m2, _gelu(y1), 0.0)  # zero on padded samples: they add nothing to dW2
        g = tl.load(DTAPS + rb[:, None] * 9 * C + (slot - 1) * C + ch[None, :], mask=m2, other=0.0)
        mat = tl.dot(tl.trans(g), a, input_precision=PREC)
        vec = tl.sum(g, axis=0)
    return mat, vec


@triton.jit
def _slot_partial(WS, chunk, BD: tl.constexpr):
    """The pointers of this program's slot sums ([BD, BD], then [BD]) in chunk ``chunk``'s workspace
    rows of the predictor's backward (``[10 * heads, BD * BD + BD]`` a chunk, fp32)."""
    c, sq = _square(BD)
    ws = WS + (chunk * tl.num_programs(0) + tl.program_id(0)) * (BD * BD + BD)
    return ws + sq, ws + BD * BD + c


@triton.jit
def predictor_bwd(
    CTX,
    DTAPS,
    W1,
    B1,
    W2,
    DCTX,
    DW1,
    DB1,
    DW2,
    DB2,
    WS,
    B,
    N,
    C,
    chunk_blocks,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_B: tl.constexpr,
    PARTIAL: tl.constexpr,
    PREC: tl.constexpr,
):
    """Programs (head * 10 + slot, chunk): one of a head's ten weight gradients (slot 0: dW1 with
    db1, and dctx / N [B, C]; slot 1 + t: dW2 with db2 of tap t), summed over the chunk's
    ``chunk_blocks`` blocks of BLOCK_B samples in a fixed order; no atomics, bit-reproducible. With
    one chunk (PARTIAL False) the program stores the gradient; else its sums go to the chunk's
    workspace row (``[10 * heads, BD * BD + BD]`` per chunk) and :func:`predictor_bwd_merge` adds
    the chunks in order. The head's W1 is read once per program, W2's taps once per block of
    samples (slot 0)."""
    pid = tl.program_id(0)
    head = pid // 10
    slot = pid % 10
    i = tl.arange(0, BD)
    ch = head * D + i
    cmask = i < D
    w1 = _head_block(W1, ch * D, i, cmask)  # [j, i]
    b1 = tl.load(B1 + ch, mask=cmask, other=0.0).to(tl.float32)
    mat = tl.zeros([BD, BD], dtype=tl.float32)
    vec = tl.zeros([BD], dtype=tl.float32)
    first = tl.program_id(1) * chunk_blocks
    for blk in range(0, chunk_blocks):  # a trip count the launch gives: tools/kernel_phases reads it
        rb = (first + blk) * BLOCK_B + tl.arange(0, BLOCK_B)
        m, v = _slot_sums(CTX, DTAPS, W2, DCTX, w1, b1, rb, ch, i, cmask, slot, B, N, C, D, PREC)
        mat += m
        vec += v
    if PARTIAL:
        mat_at, vec_at = _slot_partial(WS, tl.program_id(1), BD)
        tl.store(mat_at, mat)
        tl.store(vec_at, vec)
    else:
        _store_slot(DW1, DB1, DW2, DB2, head, slot, mat, vec, D, BD)


@triton.jit
def predictor_bwd_merge(WS, DW1, DB1, DW2, DB2, chunks, D: tl.constexpr, BD: tl.constexpr):
    """Programs (head * 10 + slot): the chunks' workspace rows of :func:`predictor_bwd` added in
    chunk order (bit-reproducible), then stored as that slot's gradient."""
    pid = tl.program_id(0)
    mat = tl.zeros([BD, BD], dtype=tl.float32)
    vec = tl.zeros([BD], dtype=tl.float32)
    for k in range(0, chunks):
        mat_at, vec_at = _slot_partial(WS, k, BD)
        mat += tl.load(mat_at)
        vec += tl.load(vec_at)
    _store_slot(DW1, DB1, DW2, DB2, pid // 10, pid % 10, mat, vec, D, BD)
