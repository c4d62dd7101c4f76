"""Where each token of an :class:`~inline_attn.layers.AttentionRecord` sits in the image.

Every analysis measures neighbourhoods in image coordinates, so that global, windowed (Swin,
shifted windows included) and stripe (CSwin) attention are treated alike: a key is in the
3 x 3 neighbourhood of a query when both are grid tokens of the same call and their
(row, col) positions in the stage's feature map differ by at most 1 in each direction.

Conventions (see :class:`~inline_attn.layers.record.AttentionRecord`):
- ``token_coords is None``: one group (G = 1); the first ``num_prefix_tokens`` tokens are
  prefix (cls) tokens without a position; the rest are the row-major ``feat_size`` grid.
- else ``token_coords: [G, N_grid, 2]`` (row, col) per group; prefix tokens, if the call has
  any, come first and have no position. Positions outside the stage map (``map_size``) or
  negative are padding: they are never queries of a statistic nor members of a neighbourhood.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..layers.record import AttentionRecord


@dataclass
class TokenLayout:
    """Positions of one record's queries and keys, shared by all images of the batch.

    Attributes:
        coords: [G, Nq, 2] long (row, col) of each query; prefix tokens get (-1, -1).
        grid: [G, Nq] bool, True for real grid queries (not prefix, not padding).
        key_coords: [G, Nk, 2] long, top-left (row, col) of each key's cell in query units.
        key_grid: [G, Nk] bool, True for real grid keys.
        key_cell: side of a key's cell in query tokens (1 for self-attention; the spatial
            reduction ratio for PVT's reduced keys).
        num_prefix_tokens: leading tokens without a position (queries and keys).
        map_size: (H, W) of the stage's feature map the query coordinates live in.
        num_groups: G (windows / stripes per image; 1 for global attention).
    """

    coords: torch.Tensor
    grid: torch.Tensor
    key_coords: torch.Tensor
    key_grid: torch.Tensor
    key_cell: int
    num_prefix_tokens: int
    map_size: tuple[int, int]
    num_groups: int

    @property
    def num_tokens(self) -> int:
        """Nk, the number of keys each query attends over."""
        return self.key_coords.shape[1]


def _row_major(h: int, w: int, step: int = 1) -> torch.Tensor:
    rows = torch.arange(h).repeat_interleave(w) * step
    cols = torch.arange(w).repeat(h) * step
    return torch.stack([rows, cols], dim=-1)[None]  # [1, HW, 2]


def _reduced_grid(h: int, w: int, nk: int, name: str) -> tuple[int, int, int]:
    """The stride s (and grid) of keys pooled from an H x W grid: (H // s) * (W // s) == nk."""
    for s in range(2, max(h, w) + 1):
        if (h // s) * (w // s) == nk:
            return s, h // s, w // s
    raise ValueError(f"layer {name!r}: cannot place {nk} keys on a grid reduced from {h}x{w}")


def token_layout(record: AttentionRecord, map_size: Optional[tuple[int, int]] = None) -> TokenLayout:
    """The :class:`TokenLayout` of ``record`` (weights ``[B*G, h, Nq, Nk]``).

    ``map_size``: the stage's (H, W) when known (it tells padding from real tokens in padded
    windows); used for windowed / stripe calls only (default: the coordinates' bounding box).
    Global calls use ``feat_size``. Keys fewer than queries (PVT's spatial reduction) are
    placed on the grid reduced by the stride that explains their number.
    """
    nq, nk = record.weights.shape[-2], record.weights.shape[-1]
    p = int(record.num_prefix_tokens)
    cell = 1
    if record.token_coords is None:
        h, w = record.feat_size
        if p + h * w != nq:
            raise ValueError(f"layer {record.name!r}: {nq} queries but num_prefix_tokens + H*W = {p} + {h}*{w}")
        grid_coords = _row_major(h, w)
        key_grid_coords = grid_coords
        if nk != nq:
            cell, hk, wk = _reduced_grid(h, w, nk - p, record.name)
            key_grid_coords = _row_major(hk, wk, cell)
        map_size = (h, w)  # a global call sees the whole map: feat_size is authoritative
    else:
        if nk != nq:
            raise ValueError(f"layer {record.name!r}: windowed attention with {nq} queries but {nk} keys")
        grid_coords = record.token_coords.detach().to("cpu", torch.long)
        if grid_coords.dim() != 3 or grid_coords.shape[-1] != 2:
            raise ValueError(f"layer {record.name!r}: token_coords must be [G, N, 2], got {tuple(grid_coords.shape)}")
        if grid_coords.shape[1] != nk - p:
            raise ValueError(
                f"layer {record.name!r}: token_coords has {grid_coords.shape[1]} tokens per group, "
                f"expected {nk - p} (keys minus prefix tokens)"
            )
        key_grid_coords = grid_coords
        if map_size is None:
            valid = (grid_coords >= 0).all(-1)
            top = grid_coords[valid].max(dim=0).values if valid.any() else torch.zeros(2, dtype=torch.long)
            map_size = (int(top[0]) + 1, int(top[1]) + 1)
    g = grid_coords.shape[0]
    bg = record.weights.shape[0]
    if bg % g != 0:
        raise ValueError(f"layer {record.name!r}: weights batch {bg} is not a multiple of {g} groups in token_coords")
    hm, wm = map_size

    def with_prefix(c):
        c = c.expand(g, -1, -1)
        full = torch.cat([torch.full((g, p, 2), -1, dtype=torch.long), c], dim=1)
        real = (full[..., 0] >= 0) & (full[..., 1] >= 0) & (full[..., 0] < hm) & (full[..., 1] < wm)
        real[:, :p] = False
        return full, real

    coords, grid = with_prefix(grid_coords)
    key_coords, key_grid = with_prefix(key_grid_coords)
    return TokenLayout(
        coords=coords,
        grid=grid,
        key_coords=key_coords,
        key_grid=key_grid,
        key_cell=cell,
        num_prefix_tokens=p,
        map_size=(hm, wm),
        num_groups=g,
    )


def window_mask(layout: TokenLayout, k: int, device=None) -> torch.Tensor:
    """[G, Nq, Nk] bool: key j lies in the k x k window (image coordinates) centred on query i.

    Only grid tokens take part (prefix and padding rows and columns are all False); at the map's
    edges and corners the window is clipped, so it holds fewer than k*k keys. A reduced key
    (cell of s x s tokens) is in the window when its cell overlaps it.
    """
    from .masking import check_odd_window_sizes  # the check's home, which imports this module

    check_odd_window_sizes([k])
    r, s = k // 2, layout.key_cell
    q = layout.coords[:, :, None, :]  # [G, Nq, 1, 2]
    top = layout.key_coords[:, None, :, :]  # [G, 1, Nk, 2]
    # cell [top, top + s - 1] overlaps [q - r, q + r] in both directions
    near = ((top <= q + r) & (top + s - 1 >= q - r)).all(dim=-1)
    near &= layout.grid[:, :, None] & layout.key_grid[:, None, :]
    return near.to(device) if device is not None else near


def interior_queries(layout: TokenLayout, k: int) -> torch.Tensor:
    """[G, Nq] bool: grid queries whose whole k x k window lies inside the map."""
    r = k // 2
    hm, wm = layout.map_size
    c = layout.coords
    inside = (c[..., 0] >= r) & (c[..., 0] < hm - r) & (c[..., 1] >= r) & (c[..., 1] < wm - r)
    return inside & layout.grid


def expand_groups(t: torch.Tensor, batch: int) -> torch.Tensor:
    """[G, ...] -> [B*G, ...] in the records' batch-major order (index b*G + g)."""
    return t.repeat(batch, *([1] * (t.dim() - 1)))
