"""Triton kernels of the InLine layer core: forward and backward, all heads, prefix tokens and the
predicted 3x3 local residual (paper Eq. 5 and Sec. 4.2, identity feature map).

Imported only by :mod:`inline_attn.ops.fused.triton`, which sets ``TRITON_INTERPRET`` first when
the tensors live on the CPU. Per sample b and head h (d channels ``[h*d, (h+1)*d)``), with
``alpha = scale / N``:

    forward    M = alpha (K - k_bar)^T (V - v_bar)   (d x d, fp32)
               O = Q M + v_bar + R(V, w)             (R: 3x3 depthwise conv on grid tokens)
    backward   dM = Q^T G,  dQ = G M^T,  dK = alpha (V - v_bar) dM^T,
               dV = alpha (K - k_bar) dM + mean(G) + R^T(G, w),  dw[t] = sum_n G_n * V_{n+t}

Each pass is a reduction over the tokens (the d x d products, the means, the residual's weight
gradient) followed by a token-parallel pass. The centred product is accumulated in one pass,
tile by tile, with the pairwise update of Chan, Golub and LeVeque (1979): each tile's product is
centred on the tile's own means and merged with a rank-1 correction, so no sum carries the
``N k_bar v_bar^T`` term whose cancellation would cost digits at large N. Keys and values are
first shifted by their token-0 row, so the means the merge subtracts are of the spread's size
even when the activations' mean is far from zero.

Two launch shapes:

- ``fused``: one program per (sample, head) does the reduction and then the token pass (the
  second read of V / K / G mostly hits L2). Used when the (sample, head) pairs fill the GPU.
- ``split``: the reduction is split over token chunks (``*_partial``), a small kernel merges the
  chunks in a fixed order (``*_finalize``), and the token pass runs over row blocks
  (``*_rows``). Used when there are few pairs and many tokens.

Neither uses atomics: results are bit-reproducible run to run. All sums are fp32.

Layouts: q, k, v (and the upstream gradient g) are [B, N, C] with any strides (views into a qkv
projection are read in place); w9 is [B, 9, C] contiguous (tap ``t = 3 * (dy + 1) + (dx + 1)``);
outputs are [B, N, C] contiguous. Tokens ``[0, P)`` are prefix tokens (attended to, no
residual); token ``P + y * W + x`` is grid cell (y, x).

Workspace rows (fp32, one per (sample, head) and chunk): forward ``[S (BD*BD), k_mean, v_mean]``,
backward ``[S, dM (BD*BD each), k_mean, v_mean, g_sum, dw (16 rows of BD)]``; finalized rows
hold M = alpha S in place of S and the means (g_mean in place of g_sum).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile(ptr, n, sn, cols, mask):
    """Load a [BLOCK_N, BD] tile (rows n, columns given as pointer offsets) as fp32."""
    return tl.load(ptr + n[:, None] * sn + cols[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _grid_coords(n, N, P, W):
    """Token indices -> (y, x, is_grid) of the H x W grid (prefix and padding rows: is_grid False)."""
    g = n - P
    y = g // W
    x = g - y * W
    return y, x, (n < N) & (g >= 0)


@triton.jit
def _shifted_tile(ptr, sn, cols, cmask, y, x, is_grid, H, W, P, DY: tl.constexpr, DX: tl.constexpr):
    """The tile of rows at grid offset (DY, DX) from each row's cell; zero outside the grid."""
    yy = y + DY
    xx = x + DX
    ok = is_grid & (yy >= 0) & (yy < H) & (xx >= 0) & (xx < W)
    nb = P + yy * W + xx
    return tl.load(ptr + nb[:, None] * sn + cols[None, :], mask=ok[:, None] & cmask[None, :], other=0.0).to(tl.float32)


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
def _fwd_sums(
    kb,
    vb,
    k_sn,
    v_sn,
    k_col,
    v_col,
    cmask,
    ck,
    cv,
    n_lo,
    n_hi,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREC: tl.constexpr,
):
    """Centred statistics of tokens [n_lo, n_hi): means of K - ck and V - cv, S = sum K_c^T V_c."""
    cnt = 0.0
    mk = tl.zeros([BD], dtype=tl.float32)
    mv = tl.zeros([BD], dtype=tl.float32)
    s = tl.zeros([BD, BD], dtype=tl.float32)
    for start in range(n_lo, n_hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        m2 = (n < n_hi)[:, None] & cmask[None, :]
        n_valid = tl.minimum(n_hi - start, BLOCK_N).to(tl.float32)
        kt = tl.where(m2, _tile(kb, n, k_sn, k_col, m2) - ck[None, :], 0.0)
        vt = tl.where(m2, _tile(vb, n, v_sn, v_col, m2) - cv[None, :], 0.0)
        tmk, tmv, kc, vc = _tile_stats(kt, vt, m2, n_valid)
        cnt, mk, mv, s = _merge(cnt, mk, mv, s, n_valid, tmk, tmv, tl.dot(tl.trans(kc), vc, input_precision=PREC))
    return cnt, mk, mv, s


@triton.jit
def _fwd_rows(
    qb,
    vb,
    wb,
    ob,
    q_sn,
    v_sn,
    q_col,
    v_col,
    o_col,
    C,
    cmask,
    m,
    vbar,
    n0,
    n1,
    N,
    H,
    W,
    P,
    HAS_RES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREC: tl.constexpr,
):
    """O rows [n0, n1) = Q M + v_bar (+ the 3x3 residual on grid rows)."""
    for start in range(n0, n1, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        m2 = (n < n1)[:, None] & cmask[None, :]
        o = tl.dot(_tile(qb, n, q_sn, q_col, m2), m, input_precision=PREC) + vbar[None, :]
        if HAS_RES:
            y, x, is_grid = _grid_coords(n, n1, P, W)
            for t in tl.static_range(9):
                wt = tl.load(wb + t * C + o_col, mask=cmask, other=0.0).to(tl.float32)
                o += wt[None, :] * _shifted_tile(vb, v_sn, v_col, cmask, y, x, is_grid, H, W, P, t // 3 - 1, t % 3 - 1)
        tl.store(ob + n[:, None] * C + o_col[None, :], o.to(ob.dtype.element_ty), mask=m2)


@triton.jit
def _pair(pid, heads, D: tl.constexpr, BD: tl.constexpr):
    """Program id -> (sample, channel offsets of its head, channel mask)."""
    c = tl.arange(0, BD)
    return pid // heads, (pid % heads) * D + c, c < D


@triton.jit
def _row0(ptr, cols, cmask):
    """Token 0's row (the shift of the sums) as fp32."""
    return tl.load(ptr + cols, mask=cmask, other=0.0).to(tl.float32)


@triton.jit
def inline_fwd_fused(
    Q,
    K,
    V,
    W9,
    O,
    q_sb,
    q_sn,
    q_sc,
    k_sb,
    k_sn,
    k_sc,
    v_sb,
    v_sn,
    v_sc,
    N,
    C,
    H,
    W,
    P,
    heads,
    scale,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RES: tl.constexpr,
    PREC: tl.constexpr,
):
    """One program per (sample, head): the statistics, M, then every output row of that head."""
    b, ch, cmask = _pair(tl.program_id(0), heads, D, BD)
    kb, vb = K + b * k_sb, V + b * v_sb
    cv = _row0(vb, ch * v_sc, cmask)
    cnt, mk, mv, s = _fwd_sums(
        kb, vb, k_sn, v_sn, ch * k_sc, ch * v_sc, cmask, _row0(kb, ch * k_sc, cmask), cv, 0, N, BD, BLOCK_N, PREC
    )
    _fwd_rows(
        Q + b * q_sb,
        vb,
        W9 + b * 9 * C,
        O + b * N * C,
        q_sn,
        v_sn,
        ch * q_sc,
        ch * v_sc,
        ch,
        C,
        cmask,
        s * (scale / N),
        cv + mv,
        0,
        N,
        N,
        H,
        W,
        P,
        HAS_RES,
        BLOCK_N,
        PREC,
    )


@triton.jit
def inline_fwd_partial(
    K,
    V,
    WS,
    k_sb,
    k_sn,
    k_sc,
    v_sb,
    v_sn,
    v_sc,
    N,
    heads,
    chunk,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREC: tl.constexpr,
):
    """Program (sample*head, chunk): centred statistics of one token chunk -> its workspace row."""
    pid = tl.program_id(0)
    b, ch, cmask = _pair(pid, heads, D, BD)
    n_lo = tl.program_id(1) * chunk
    kb, vb = K + b * k_sb, V + b * v_sb
    cnt, mk, mv, s = _fwd_sums(
        kb,
        vb,
        k_sn,
        v_sn,
        ch * k_sc,
        ch * v_sc,
        cmask,
        _row0(kb, ch * k_sc, cmask),
        _row0(vb, ch * v_sc, cmask),
        n_lo,
        tl.minimum(n_lo + chunk, N),
        BD,
        BLOCK_N,
        PREC,
    )
    c = tl.arange(0, BD)
    ws = WS + (pid * tl.num_programs(1) + tl.program_id(1)) * (BD * BD + 2 * BD)
    tl.store(ws + c[:, None] * BD + c[None, :], s)
    tl.store(ws + BD * BD + c, mk)
    tl.store(ws + BD * BD + BD + c, mv)


@triton.jit
def inline_fwd_finalize(V, WS, FIN, v_sb, v_sc, N, chunk, SPLIT, heads, scale, D: tl.constexpr, BD: tl.constexpr):
    """Program per (sample, head): merge its SPLIT chunk rows in order -> [M, v_bar] (FIN)."""
    pid = tl.program_id(0)
    b, ch, cmask = _pair(pid, heads, D, BD)
    c = tl.arange(0, BD)
    sq = c[:, None] * BD + c[None, :]
    row = BD * BD + 2 * BD
    cnt = 0.0
    mk = tl.zeros([BD], dtype=tl.float32)
    mv = tl.zeros([BD], dtype=tl.float32)
    s = tl.zeros([BD, BD], dtype=tl.float32)
    for i in range(0, SPLIT):
        ws = WS + (pid * SPLIT + i) * row
        n_i = tl.minimum(chunk, N - i * chunk).to(tl.float32)
        cnt, mk, mv, s = _merge(
            cnt, mk, mv, s, n_i, tl.load(ws + BD * BD + c), tl.load(ws + BD * BD + BD + c), tl.load(ws + sq)
        )
    fin = FIN + pid * (BD * BD + BD)
    tl.store(fin + sq, s * (scale / N))
    tl.store(fin + BD * BD + c, _row0(V + b * v_sb, ch * v_sc, cmask) + mv)


@triton.jit
def inline_fwd_rows(
    Q,
    V,
    W9,
    O,
    FIN,
    q_sb,
    q_sn,
    q_sc,
    v_sb,
    v_sn,
    v_sc,
    N,
    C,
    H,
    W,
    P,
    heads,
    rows,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RES: tl.constexpr,
    PREC: tl.constexpr,
):
    """Program (sample*head, row block): output rows [i*rows, (i+1)*rows) from the finalized M."""
    pid = tl.program_id(0)
    b, ch, cmask = _pair(pid, heads, D, BD)
    c = tl.arange(0, BD)
    fin = FIN + pid * (BD * BD + BD)
    m = tl.load(fin + c[:, None] * BD + c[None, :])
    vbar = tl.load(fin + BD * BD + c)
    n0 = tl.program_id(1) * rows
    _fwd_rows(
        Q + b * q_sb,
        V + b * v_sb,
        W9 + b * 9 * C,
        O + b * N * C,
        q_sn,
        v_sn,
        ch * q_sc,
        ch * v_sc,
        ch,
        C,
        cmask,
        m,
        vbar,
        n0,
        tl.minimum(n0 + rows, N),
        N,
        H,
        W,
        P,
        HAS_RES,
        BLOCK_N,
        PREC,
    )


@triton.jit
def _bwd_sums(
    qb,
    kb,
    vb,
    gb,
    q_sn,
    k_sn,
    v_sn,
    g_sn,
    q_col,
    k_col,
    v_col,
    g_col,
    cmask,
    ck,
    cv,
    n_lo,
    n_hi,
    N,
    H,
    W,
    P,
    HAS_RES: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREC: tl.constexpr,
):
    """Over tokens [n_lo, n_hi): the forward's statistics (M is recomputed), dM = Q^T G, sum G and
    the residual's weight gradient dw[t] = sum_n G_n * V_{n+t} ([16, BD], rows 0..8 used)."""
    cnt = 0.0
    mk = tl.zeros([BD], dtype=tl.float32)
    mv = tl.zeros([BD], dtype=tl.float32)
    s = tl.zeros([BD, BD], dtype=tl.float32)
    dm = tl.zeros([BD, BD], dtype=tl.float32)
    gs = tl.zeros([BD], dtype=tl.float32)
    taps = tl.arange(0, 16)
    dw = tl.zeros([16, BD], dtype=tl.float32)
    for start in range(n_lo, n_hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        m2 = (n < n_hi)[:, None] & cmask[None, :]
        n_valid = tl.minimum(n_hi - start, BLOCK_N).to(tl.float32)
        kt = tl.where(m2, _tile(kb, n, k_sn, k_col, m2) - ck[None, :], 0.0)
        tmk, tmv, kc, vc = _tile_stats(kt, tl.where(m2, _tile(vb, n, v_sn, v_col, m2) - cv[None, :], 0.0), m2, n_valid)
        cnt, mk, mv, s = _merge(cnt, mk, mv, s, n_valid, tmk, tmv, tl.dot(tl.trans(kc), vc, input_precision=PREC))
        gt = _tile(gb, n, g_sn, g_col, m2)
        dm += tl.dot(tl.trans(_tile(qb, n, q_sn, q_col, m2)), gt, input_precision=PREC)
        gs += tl.sum(gt, axis=0)
        if HAS_RES:
            y, x, is_grid = _grid_coords(n, n_hi, P, W)
            gt = tl.where(is_grid[:, None], gt, 0.0)
            for t in tl.static_range(9):
                vn = _shifted_tile(vb, v_sn, v_col, cmask, y, x, is_grid, H, W, P, t // 3 - 1, t % 3 - 1)
                dw += tl.where(taps[:, None] == t, tl.sum(gt * vn, axis=0)[None, :], 0.0)
    return cnt, mk, mv, s, dm, gs, dw


@triton.jit
def _bwd_rows(
    gb,
    kb,
    vb,
    wb,
    dqb,
    dkb,
    dvb,
    g_sn,
    k_sn,
    v_sn,
    g_col,
    k_col,
    v_col,
    o_col,
    C,
    cmask,
    m,
    dm,
    kbar,
    vbar,
    gbar,
    alpha,
    n0,
    n1,
    N,
    H,
    W,
    P,
    HAS_RES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREC: tl.constexpr,
):
    """dQ, dK, dV rows [n0, n1) from M, dM and the means."""
    for start in range(n0, n1, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        m2 = (n < n1)[:, None] & cmask[None, :]
        gt = _tile(gb, n, g_sn, g_col, m2)
        kc = tl.where(m2, _tile(kb, n, k_sn, k_col, m2) - kbar[None, :], 0.0)
        vc = tl.where(m2, _tile(vb, n, v_sn, v_col, m2) - vbar[None, :], 0.0)
        dq = tl.dot(gt, tl.trans(m), input_precision=PREC)
        dk = tl.dot(vc, tl.trans(dm), input_precision=PREC) * alpha
        dv = tl.dot(kc, dm, input_precision=PREC) * alpha + gbar[None, :]
        if HAS_RES:
            # V at cell (y, x) fed the output at (y - dy, x - dx) through tap (dy, dx)
            y, x, is_grid = _grid_coords(n, n1, P, W)
            for t in tl.static_range(9):
                wt = tl.load(wb + t * C + o_col, mask=cmask, other=0.0).to(tl.float32)
                dv += wt[None, :] * _shifted_tile(gb, g_sn, g_col, cmask, y, x, is_grid, H, W, P, 1 - t // 3, 1 - t % 3)
        out = o_col[None, :] + n[:, None] * C
        tl.store(dqb + out, dq.to(dqb.dtype.element_ty), mask=m2)
        tl.store(dkb + out, dk.to(dkb.dtype.element_ty), mask=m2)
        tl.store(dvb + out, dv.to(dvb.dtype.element_ty), mask=m2)


@triton.jit
def _store_dw(dwb, C, o_col, cmask, dw):
    taps = tl.arange(0, 16)
    tl.store(
        dwb + taps[:, None] * C + o_col[None, :], dw.to(dwb.dtype.element_ty), mask=(taps < 9)[:, None] & cmask[None, :]
    )


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
    q_sb,
    q_sn,
    q_sc,
    k_sb,
    k_sn,
    k_sc,
    v_sb,
    v_sn,
    v_sc,
    g_sb,
    g_sn,
    g_sc,
    N,
    C,
    H,
    W,
    P,
    heads,
    scale,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RES: tl.constexpr,
    PREC: tl.constexpr,
):
    """One program per (sample, head): the backward sums, then every gradient row of that head."""
    b, ch, cmask = _pair(tl.program_id(0), heads, D, BD)
    kb, vb, gb = K + b * k_sb, V + b * v_sb, G + b * g_sb
    k_col, v_col, g_col = ch * k_sc, ch * v_sc, ch * g_sc
    ck, cv = _row0(kb, k_col, cmask), _row0(vb, v_col, cmask)
    cnt, mk, mv, s, dm, gs, dw = _bwd_sums(
        Q + b * q_sb,
        kb,
        vb,
        gb,
        q_sn,
        k_sn,
        v_sn,
        g_sn,
        ch * q_sc,
        k_col,
        v_col,
        g_col,
        cmask,
        ck,
        cv,
        0,
        N,
        N,
        H,
        W,
        P,
        HAS_RES,
        BD,
        BLOCK_N,
        PREC,
    )
    alpha = scale / N
    if HAS_RES:
        _store_dw(DW + b * 9 * C, C, ch, cmask, dw)
    _bwd_rows(
        gb,
        kb,
        vb,
        W9 + b * 9 * C,
        DQ + b * N * C,
        DK + b * N * C,
        DV + b * N * C,
        g_sn,
        k_sn,
        v_sn,
        g_col,
        k_col,
        v_col,
        ch,
        C,
        cmask,
        s * alpha,
        dm,
        ck + mk,
        cv + mv,
        gs / N,
        alpha,
        0,
        N,
        N,
        H,
        W,
        P,
        HAS_RES,
        BLOCK_N,
        PREC,
    )


@triton.jit
def inline_bwd_partial(
    Q,
    K,
    V,
    G,
    WS,
    q_sb,
    q_sn,
    q_sc,
    k_sb,
    k_sn,
    k_sc,
    v_sb,
    v_sn,
    v_sc,
    g_sb,
    g_sn,
    g_sc,
    N,
    H,
    W,
    P,
    heads,
    chunk,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RES: tl.constexpr,
    PREC: tl.constexpr,
):
    """Program (sample*head, chunk): the backward sums over one token chunk -> its workspace row."""
    pid = tl.program_id(0)
    b, ch, cmask = _pair(pid, heads, D, BD)
    n_lo = tl.program_id(1) * chunk
    n_hi = tl.minimum(n_lo + chunk, N)
    kb, vb = K + b * k_sb, V + b * v_sb
    cnt, mk, mv, s, dm, gs, dw = _bwd_sums(
        Q + b * q_sb,
        kb,
        vb,
        G + b * g_sb,
        q_sn,
        k_sn,
        v_sn,
        g_sn,
        ch * q_sc,
        ch * k_sc,
        ch * v_sc,
        ch * g_sc,
        cmask,
        _row0(kb, ch * k_sc, cmask),
        _row0(vb, ch * v_sc, cmask),
        n_lo,
        n_hi,
        N,
        H,
        W,
        P,
        HAS_RES,
        BD,
        BLOCK_N,
        PREC,
    )
    c = tl.arange(0, BD)
    sq = c[:, None] * BD + c[None, :]
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
def inline_bwd_finalize(
    K,
    V,
    WS,
    FIN,
    DW,
    k_sb,
    k_sc,
    v_sb,
    v_sc,
    N,
    C,
    heads,
    chunk,
    SPLIT,
    scale,
    D: tl.constexpr,
    BD: tl.constexpr,
    HAS_RES: tl.constexpr,
):
    """Program per (sample, head): merge its SPLIT chunk rows in order -> [M, dM, k_bar, v_bar,
    g_bar] (FIN); writes the residual's weight gradient of its head."""
    pid = tl.program_id(0)
    b, ch, cmask = _pair(pid, heads, D, BD)
    c = tl.arange(0, BD)
    sq = c[:, None] * BD + c[None, :]
    taps = tl.arange(0, 16)
    row = 2 * BD * BD + 19 * BD
    cnt = 0.0
    mk = tl.zeros([BD], dtype=tl.float32)
    mv = tl.zeros([BD], dtype=tl.float32)
    s = tl.zeros([BD, BD], dtype=tl.float32)
    dm = tl.zeros([BD, BD], dtype=tl.float32)
    gs = tl.zeros([BD], dtype=tl.float32)
    dw = tl.zeros([16, BD], dtype=tl.float32)
    for i in range(0, SPLIT):
        ws = WS + (pid * SPLIT + i) * row
        vec = ws + 2 * BD * BD
        n_i = tl.minimum(chunk, N - i * chunk).to(tl.float32)
        cnt, mk, mv, s = _merge(cnt, mk, mv, s, n_i, tl.load(vec + c), tl.load(vec + BD + c), tl.load(ws + sq))
        dm += tl.load(ws + BD * BD + sq)
        gs += tl.load(vec + 2 * BD + c)
        if HAS_RES:
            dw += tl.load(vec + 3 * BD + taps[:, None] * BD + c[None, :])
    fin = FIN + pid * (2 * BD * BD + 3 * BD)
    tl.store(fin + sq, s * (scale / N))
    tl.store(fin + BD * BD + sq, dm)
    tl.store(fin + 2 * BD * BD + c, _row0(K + b * k_sb, ch * k_sc, cmask) + mk)
    tl.store(fin + 2 * BD * BD + BD + c, _row0(V + b * v_sb, ch * v_sc, cmask) + mv)
    tl.store(fin + 2 * BD * BD + 2 * BD + c, gs / N)
    if HAS_RES:
        _store_dw(DW + b * 9 * C, C, ch, cmask, dw)


@triton.jit
def inline_bwd_rows(
    K,
    V,
    W9,
    G,
    DQ,
    DK,
    DV,
    FIN,
    k_sb,
    k_sn,
    k_sc,
    v_sb,
    v_sn,
    v_sc,
    g_sb,
    g_sn,
    g_sc,
    N,
    C,
    H,
    W,
    P,
    heads,
    scale,
    rows,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RES: tl.constexpr,
    PREC: tl.constexpr,
):
    """Program (sample*head, row block): gradient rows [i*rows, (i+1)*rows) from the finalized row."""
    pid = tl.program_id(0)
    b, ch, cmask = _pair(pid, heads, D, BD)
    c = tl.arange(0, BD)
    sq = c[:, None] * BD + c[None, :]
    fin = FIN + pid * (2 * BD * BD + 3 * BD)
    vec = fin + 2 * BD * BD
    n0 = tl.program_id(1) * rows
    _bwd_rows(
        G + b * g_sb,
        K + b * k_sb,
        V + b * v_sb,
        W9 + b * 9 * C,
        DQ + b * N * C,
        DK + b * N * C,
        DV + b * N * C,
        g_sn,
        k_sn,
        v_sn,
        ch * g_sc,
        ch * k_sc,
        ch * v_sc,
        ch,
        C,
        cmask,
        tl.load(fin + sq),
        tl.load(fin + BD * BD + sq),
        tl.load(vec + c),
        tl.load(vec + BD + c),
        tl.load(vec + 2 * BD + c),
        scale / N,
        n0,
        tl.minimum(n0 + rows, N),
        N,
        H,
        W,
        P,
        HAS_RES,
        BLOCK_N,
        PREC,
    )


# The residual predictor (paper Sec. 4.2): per sample b and head h (the predictor's groups are the
# heads), with x the layer input and d channels ``ch = [h*d, (h+1)*d)``:
#
#     forward    ctx = mean_n x[b, n, ch];  y1 = W1_h ctx + b1;  a = GELU(y1)
#                taps[t] = W2_{h,t} a + b2_t       (W2_{h,t}[j, i] = W2[9 * ch_j + t, i], t < 9)
#     backward   da = sum_t W2_{h,t}^T dtaps[t];  dy1 = da * GELU'(y1);  dctx = W1_h^T dy1 / N
#                dW1_h = sum_b dy1 ctx^T,  dW2_{h,t} = sum_b dtaps[t] a^T  (and the biases' sums)
#
# W1 is [C, d] and W2 [9C, d] (the grouped 1x1 convolutions' weights, contiguous); everything in fp32.

_SQRT1_2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


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
    x_sb,
    x_sn,
    x_sc,
    N,
    C,
    heads,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One program per (sample, head): the token mean of x over the head's channels, then the
    head's two products and the GELU; writes ctx [B, C] and the taps [B, 9, C] (fp32)."""
    b, ch, cmask = _pair(tl.program_id(0), heads, D, BD)
    i = tl.arange(0, BD)
    xb = X + b * x_sb
    acc = tl.zeros([BD], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        acc += tl.sum(_tile(xb, n, x_sn, ch * x_sc, (n < N)[:, None] & cmask[None, :]), axis=0)
    ctx = acc / N
    tl.store(CTX + b * C + ch, ctx, mask=cmask)
    w1 = _head_block(W1, ch * D, i, cmask)  # [j, i]
    y1 = tl.sum(w1 * ctx[None, :], axis=1) + tl.load(B1 + ch, mask=cmask, other=0.0).to(tl.float32)
    a = _gelu(y1)
    for t in tl.static_range(9):
        w2 = _head_block(W2, (9 * ch + t) * D, i, cmask)
        tap = tl.sum(w2 * a[None, :], axis=1) + tl.load(B2 + 9 * ch + t, mask=cmask, other=0.0).to(tl.float32)
        tl.store(TAPS + b * 9 * C + t * C + ch, tap, mask=cmask)


@triton.jit
def _predictor_hidden(CTX, rb, ch, C, w1, b1, cmask, bmask, PREC: tl.constexpr):
    """ctx rows rb [BLOCK_B, BD] and the first product's pre-activation y1 [BLOCK_B, BD]."""
    ctx = tl.load(CTX + rb[:, None] * C + ch[None, :], mask=bmask[:, None] & cmask[None, :], other=0.0)
    return ctx, tl.dot(ctx, tl.trans(w1), input_precision=PREC) + b1[None, :]


@triton.jit
def _tap_rows(DTAPS, rb, t, C, ch, bmask, cmask):
    """Tap t's gradient for samples rb and the head's channels: [BLOCK_B, BD], zero on padding."""
    return tl.load(DTAPS + rb[:, None] * 9 * C + t * C + ch[None, :], mask=bmask[:, None] & cmask[None, :], other=0.0)


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
    B,
    N,
    C,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_B: tl.constexpr,
    PREC: tl.constexpr,
):
    """Programs (head, part): part 0 takes the gradient back through both products to ctx (dctx / N
    [B, C], dW1, db1); part 1 + t sums tap t's weight gradient (dW2 rows ``9 * ch + t``, db2) over
    the samples. Each loops over the samples in blocks of BLOCK_B, in a fixed order (no atomics)."""
    head = tl.program_id(0)
    part = tl.program_id(1)
    i = tl.arange(0, BD)
    ch = head * D + i
    cmask = i < D
    w1 = _head_block(W1, ch * D, i, cmask)  # [j, i]
    b1 = tl.load(B1 + ch, mask=cmask, other=0.0).to(tl.float32)
    if part == 0:
        dw1 = tl.zeros([BD, BD], dtype=tl.float32)
        db1 = tl.zeros([BD], dtype=tl.float32)
        for start in range(0, B, BLOCK_B):
            rb = start + tl.arange(0, BLOCK_B)
            bmask = rb < B
            ctx, y1 = _predictor_hidden(CTX, rb, ch, C, w1, b1, cmask, bmask, PREC)
            da = tl.zeros([BLOCK_B, BD], dtype=tl.float32)
            for t in tl.static_range(9):
                g = _tap_rows(DTAPS, rb, t, C, ch, bmask, cmask)
                da += tl.dot(g, _head_block(W2, (9 * ch + t) * D, i, cmask), input_precision=PREC)
            dy1 = da * _gelu_grad(y1)  # zero on padded rows: their dtaps were loaded as zeros
            dw1 += tl.dot(tl.trans(dy1), ctx, input_precision=PREC)
            db1 += tl.sum(dy1, axis=0)
            dctx = tl.dot(dy1, w1, input_precision=PREC) / N
            tl.store(DCTX + rb[:, None] * C + ch[None, :], dctx, mask=bmask[:, None] & cmask[None, :])
        tl.store(DW1 + (ch * D)[:, None] + i[None, :], dw1, mask=cmask[:, None] & cmask[None, :])
        tl.store(DB1 + ch, db1, mask=cmask)
    else:
        t = part - 1
        dw2 = tl.zeros([BD, BD], dtype=tl.float32)
        db2 = tl.zeros([BD], dtype=tl.float32)
        for start in range(0, B, BLOCK_B):
            rb = start + tl.arange(0, BLOCK_B)
            bmask = rb < B
            ctx, y1 = _predictor_hidden(CTX, rb, ch, C, w1, b1, cmask, bmask, PREC)
            g = _tap_rows(DTAPS, rb, t, C, ch, bmask, cmask)
            dw2 += tl.dot(tl.trans(g), _gelu(y1), input_precision=PREC)
            db2 += tl.sum(g, axis=0)
        tl.store(DW2 + ((9 * ch + t) * D)[:, None] + i[None, :], dw2, mask=cmask[:, None] & cmask[None, :])
        tl.store(DB2 + 9 * ch + t, db2, mask=cmask)
