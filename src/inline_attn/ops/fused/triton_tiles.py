"""The tile-level pieces every Triton kernel of the InLine layer core is written with: an operand's
view of one (sample, head), row blocks, loads and stores of tiles, the token grid's cells and the
predicted 3x3 local residual (paper Eq. 5) and its weights' gradient.

The kernels of :mod:`.triton_kernels` and :mod:`.triton_stream` import them by name and call them
unqualified: under ``torch.compile``, inductor writes a user-defined kernel out with the Triton
functions it names as globals, and a module attribute (``tiles.NAME``) is not among them (the kernel
then fails to compile with ``NameError``). Triton inlines each call, so a kernel compiles to the same
program as with the code written in place.

A *view* is an operand of one (sample, head) inside a kernel: ``(the sample's base pointer, the
token stride, the head's column offsets)`` (:func:`head_view` for the strided inputs,
:func:`dense_view` for the contiguous w9 and outputs). ``geo = (N, C, H, W, P, heads)``: tokens
``[0, P)`` are prefix tokens (attended to, no residual); token ``P + y * W + x`` is grid cell
(y, x); w9 is [B, 9, C] with tap ``t = 3 * (dy + 1) + (dx + 1)``. Tiles are [rows, BD] with the
head's D channels padded to BD (``cmask``: the channels below D).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def program_pair(pid, heads, D: tl.constexpr, BD: tl.constexpr):
    """Program id -> (sample, channel offsets of its head, channel mask)."""
    c = tl.arange(0, BD)
    return pid // heads, (pid % heads) * D + c, c < D


@triton.jit
def head_view(ptr, st, b, ch):
    """Sample b of a [B, rows, C] tensor with strides st = (batch, row, channel), at a head's
    channels ch: (the sample's base pointer, the row stride, the columns' pointer offsets)."""
    return ptr + b * st[0], st[1], ch * st[2]


@triton.jit
def dense_view(ptr, b, rows, C, ch):
    """The view of sample b of a contiguous [B, rows, C] tensor (w9, the outputs) at channels ch."""
    return ptr + b * rows * C, C, ch


@triton.jit
def grad_views(DQ, DK, DV, b, N, C, ch):
    """The views of sample b's dQ, dK, dV ([B, N, C] contiguous) at channels ch."""
    return dense_view(DQ, b, N, C, ch), dense_view(DK, b, N, C, ch), dense_view(DV, b, N, C, ch)


@triton.jit
def row_block(start, n_hi, cmask, BLOCK_N: tl.constexpr):
    """The row block at start: its token indices n and the [BLOCK_N, BD] mask of rows < n_hi."""
    n = start + tl.arange(0, BLOCK_N)
    return n, (n < n_hi)[:, None] & cmask[None, :]


@triton.jit
def load_tile(view, n, mask):
    """Load a [BLOCK_N, BD] tile of a view's rows n as fp32."""
    ptr, sn, cols = view
    return tl.load(ptr + n[:, None] * sn + cols[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def load_tile_t(view, n, mask, AS_STORED: tl.constexpr = False):
    """The transposed tile, [BD, BLOCK_N], of a view's rows n (``mask``: the [BLOCK_N, BD] tile's),
    fp32 or, with AS_STORED, in the view's dtype: loaded transposed, a product's transposed operand
    (Q^T in dM = Q^T G) needs no layout change through shared memory (``tl.trans`` of a loaded tile
    took eight barriers)."""
    ptr, sn, cols = view
    t = tl.load(ptr + n[None, :] * sn + cols[:, None], mask=tl.trans(mask), other=0.0)
    if not AS_STORED:
        t = t.to(tl.float32)
    return t


@triton.jit
def load_centred(view, n, mask, shift, mean=None):
    """The fp32 tile of a view's rows n minus ``shift`` (a [BD] row: K's or V's token-0 row, which
    keeps the sums' rounding small) and then minus ``mean`` (the shifted rows' mean, where given),
    masked rows zero. Subtracted one after the other: shift + mean rounded to one row would move
    every centred row alike by that rounding (up to half an ulp of K's or V's mean), an error the
    backward's dK = alpha Vc dM^T and dV = alpha Kc dM carry whole, as they take the centred rows
    to sum to zero."""
    t = load_tile(view, n, mask) - shift[None, :]
    if mean is not None:
        t = t - mean[None, :]
    return tl.where(mask, t, 0.0)


@triton.jit
def load_row(view, i, cmask):
    """Row i of a view as fp32 (row 0 of K / V: the shift of the sums; row t of w9: tap t)."""
    ptr, sn, cols = view
    return tl.load(ptr + i * sn + cols, mask=cmask, other=0.0).to(tl.float32)


@triton.jit
def broadcast_row(row, ROWS: tl.constexpr):
    """The fp32 [ROWS, BD] tile whose every row is ``row`` (a mean): the tile the residual's taps are
    added to and the product then accumulated into (``tl.dot(a, b, acc)``), so that the taps' tiles
    are summed in the layout they are loaded in and only the sum is moved into the product's
    layout (added to the product instead, each tap's tile was moved on its own, through shared
    memory, with barriers between the taps' loads)."""
    return tl.zeros([ROWS, row.shape[0]], dtype=tl.float32) + row[None, :]


@triton.jit
def store_tile(view, n, val, mask):
    """Store a [rows, BD] tile at a view's rows n, in the view's dtype."""
    ptr, sn, cols = view
    tl.store(ptr + n[:, None] * sn + cols[None, :], val.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def grid_cells(n, n_hi, geo):
    """Token indices -> cells (y, x, is_grid) of the H x W grid (prefix rows and rows from n_hi on:
    is_grid False)."""
    _, _, H, W, P, _ = geo
    g = n - P
    y = g // W
    x = g - y * W
    return y, x, (n < n_hi) & (g >= 0)


@triton.jit
def neighbour_tile(view, cmask, cells, geo, dy, dx):
    """The fp32 tile of the rows at grid offset (dy, dx) from each row's cell; zero outside the grid."""
    _, _, H, W, P, _ = geo
    y, x, is_grid = cells
    yy = y + dy
    xx = x + dx
    ok = is_grid & (yy >= 0) & (yy < H) & (xx >= 0) & (xx < W)
    return load_tile(view, P + yy * W + xx, ok[:, None] & cmask[None, :])


@triton.jit
def add_taps(acc, w9, src, cmask, cells, geo, SIGN: tl.constexpr, SERIAL: tl.constexpr = False):
    """acc + sum_t w9[t] * (src at grid offset SIGN * (dy, dx) of tap t), added tap by tap: the 3x3
    residual (SIGN 1) or its transpose (SIGN -1: V at cell (y, x) fed the output at (y - dy, x - dx)).

    ``acc`` should be a tile in the loads' layout (:func:`broadcast_row`), the product then
    accumulated into the result: added to a ``tl.dot`` result instead, every tap's tile is moved into
    the product's layout through shared memory, two barriers a tap. By default the kernel's rows run
    as a loop and a row's three taps unrolled: three shifted tile loads in flight at a time (all nine
    unrolled hoist their loads together and the resident kernels spill; ptxas for sm_90,
    docs/benchmarks.md "Kernel resources"). SERIAL: one loop over the nine taps, one load in flight
    (nine round trips, not three) and fewer live registers (the resident forward's largest tiles:
    two programs a multiprocessor instead of one)."""
    if SERIAL:
        for t in range(9):
            wt = load_row(w9, t, cmask)
            acc += wt[None, :] * neighbour_tile(src, cmask, cells, geo, SIGN * (t // 3 - 1), SIGN * (t % 3 - 1))
    else:
        for r in range(3):
            for col in tl.static_range(3):
                wt = load_row(w9, 3 * r + col, cmask)
                acc += wt[None, :] * neighbour_tile(src, cmask, cells, geo, SIGN * (r - 1), SIGN * (col - 1))
    return acc


@triton.constexpr_function
def lane_rows(rows, bd, bits):
    """Rows of a [rows, bd] tile that one warp's 32 lanes hold when the tile was loaded from
    ``bits``-bit elements with contiguous columns: Triton lays it out as 16-byte vectors along each
    row, the lanes over the next rows, the program's warps over the rows after those, then register
    repeats."""
    return min(rows, 32 // max(1, min(32, bd * bits // 128)))


@triton.constexpr_function
def _one_warp():
    return 1


# The program's warps, a compile-time constant. The interpreter has no warps and runs a tile as one
# array: any grouping of its rows gives the same sums there.
program_warps = _one_warp if triton.knobs.runtime.interpret else tl.extra.cuda.num_warps


@triton.constexpr_function
def warp_groups(rows, bd, bits, warps):
    """Row groups :func:`warp_sums` keeps apart in such a tile: one a warp (fewer for a short tile)."""
    return max(1, min(warps, rows // lane_rows(rows, bd, bits)))


@triton.jit
def warp_sums(x, BITS: tl.constexpr):
    """Column sums of x [rows, BD] per warp, [warps, BD]: with the layout of a tile loaded from
    BITS-bit elements (:func:`lane_rows`), each warp sums its own rows in registers and lane
    shuffles (no shared memory, no barrier); summing the result's rows gives the column sums.
    Another layout gives the same sums after a layout change."""
    ROWS: tl.constexpr = x.shape[0]
    BD: tl.constexpr = x.shape[1]
    LANES: tl.constexpr = lane_rows(ROWS, BD, BITS)
    GROUPS: tl.constexpr = warp_groups(ROWS, BD, BITS, program_warps())
    parts = tl.reshape(x, [ROWS // (GROUPS * LANES), GROUPS, LANES, BD])
    return tl.sum(tl.sum(parts, axis=2), axis=0)


@triton.jit
def add_taps_grad(dw, taps, g, v, cmask, cells, geo):
    """dw + one tile's share of the residual's weight gradient, dw[t] += sum_n G_n * V_{n+t} over
    the tile's grid rows (g: the fp32 tile of G at the cells; dw: [16, BD], rows 0..8 used), each
    tap's sum reduced across warps at once: a token loop's dw stays one compact tile (nine sums kept
    per warp through the loop, as :func:`taps_grad` keeps them, spill the fused kernels).

    ``taps`` is ``tl.arange(0, 16)``, made by the caller before its token loop: made here, inside
    the loop, the kernel compiles to the same instructions in another order."""
    g = tl.where(cells[2][:, None], g, 0.0)
    for t in range(9):  # a loop: unrolled, the nine tiles' loads are hoisted together and spill
        vn = neighbour_tile(v, cmask, cells, geo, t // 3 - 1, t % 3 - 1)
        dw += tl.where(taps[:, None] == t, tl.sum(g * vn, axis=0)[None, :], 0.0)
    return dw


@triton.jit
def taps_grad(g, v, cmask, cells, geo):
    """The residual's weight gradient of a tile, dw[t] = sum_n G_n * V_{n+t} over its grid rows,
    [16, BD] (rows 0..8; g: the fp32 tile of G at the cells): the nine sums kept per warp
    (:func:`warp_sums`) and reduced across warps once, not once a tap. For a whole (sample, head)
    in one tile (the resident kernels); in a token loop the per-warp sums spill (:func:`add_taps_grad`)."""
    g = tl.where(cells[2][:, None], g, 0.0)
    BITS: tl.constexpr = v[0].dtype.element_ty.primitive_bitwidth
    taps = tl.arange(0, 16)
    dw = tl.zeros([16, warp_groups(g.shape[0], g.shape[1], BITS, program_warps()), g.shape[1]], dtype=tl.float32)
    for t in range(9):  # a loop: unrolled, the nine tiles' loads are hoisted together and spill
        vn = neighbour_tile(v, cmask, cells, geo, t // 3 - 1, t % 3 - 1)
        dw += tl.where(taps[:, None, None] == t, warp_sums(g * vn, BITS)[None, :, :], 0.0)
    return tl.sum(dw, axis=1)


@triton.jit
def add_taps_grad_rows(dws, g, v, cmask, cells, geo):
    """dws + one tile's products G_n * V_{n+t} for the nine taps t, kept per row (a tuple of nine
    [rows, BD] fp32 tiles, reduced over their rows after the token loop: no cross-warp reduction per
    tile)."""
    g = tl.where(cells[2][:, None], g, 0.0)
    out = ()
    for t in tl.static_range(9):
        out = out + (dws[t] + g * neighbour_tile(v, cmask, cells, geo, t // 3 - 1, t % 3 - 1),)
    return out


@triton.jit
def store_taps_grad_rows(DW, b, C, ch, cmask, dws):
    """Taps 0..8 of one (sample, head)'s residual weight gradient, dws kept per row -> DW [B, 9, C],
    stored tap by tap: gathered into one tile for :func:`store_taps_grad` instead, the streaming
    backward at head dim 64 takes 254 registers on sm_80 / 86 against 228 (the same barriers)."""
    view = dense_view(DW, b, 9, C, ch)
    for t in tl.static_range(9):
        tl.store(view[0] + t * view[1] + view[2], tl.sum(dws[t], axis=0).to(DW.dtype.element_ty), mask=cmask)


@triton.jit
def store_taps_grad(DW, b, C, ch, cmask, dw):
    """Taps 0..8 of one (sample, head)'s residual weight gradient dw [16, BD] -> DW [B, 9, C]."""
    taps = tl.arange(0, 16)
    store_tile(dense_view(DW, b, 9, C, ch), taps, dw, (taps < 9)[:, None] & cmask[None, :])
