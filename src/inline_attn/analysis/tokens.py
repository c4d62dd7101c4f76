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
    """Positions of one record's tokens, shared by all images of the batch.

    Attributes:
        coords: [G, N, 2] long (row, col) per token; prefix tokens get (-1, -1).
        grid: [G, N] bool, True for real grid tokens (not prefix, not padding).
        num_prefix_tokens: leading tokens without a position.
        map_size: (H, W) of the stage's feature map the coordinates live in.
        num_groups: G (windows / stripes per image; 1 for global attention).
    """

    coords: torch.Tensor
    grid: torch.Tensor
    num_prefix_tokens: int
    map_size: tuple[int, int]
    num_groups: int

    @property
    def num_tokens(self) -> int:
        return self.coords.shape[1]


def token_layout(record: AttentionRecord, map_size: Optional[tuple[int, int]] = None) -> TokenLayout:
    """The :class:`TokenLayout` of ``record`` (weights ``[B*G, h, N, N]``).

    ``map_size``: the stage's (H, W) when known (it tells padding from real tokens in padded
    windows); used for windowed / stripe calls only (default: the coordinates' bounding box).
    Global calls use ``feat_size``.
    """
    n = record.weights.shape[-1]
    p = int(record.num_prefix_tokens)
    if record.token_coords is None:
        h, w = record.feat_size
        if p + h * w != n:
            raise ValueError(
                f"layer {record.name!r}: {n} keys but num_prefix_tokens + H*W = {p} + {h}*{w}"
            )
        rows = torch.arange(h).repeat_interleave(w)
        cols = torch.arange(w).repeat(h)
        grid_coords = torch.stack([rows, cols], dim=-1)[None]  # [1, HW, 2]
        map_size = (h, w)  # a global call sees the whole map: feat_size is authoritative
    else:
        grid_coords = record.token_coords.detach().to("cpu", torch.long)
        if grid_coords.dim() != 3 or grid_coords.shape[-1] != 2:
            raise ValueError(
                f"layer {record.name!r}: token_coords must be [G, N, 2], got {tuple(grid_coords.shape)}"
            )
        if grid_coords.shape[1] == n - p:
            pass
        elif grid_coords.shape[1] == n and p == 0:
            pass
        else:
            raise ValueError(
                f"layer {record.name!r}: token_coords has {grid_coords.shape[1]} tokens per group, "
                f"expected {n - p} (keys minus prefix tokens)"
            )
        if map_size is None:
            valid = (grid_coords >= 0).all(-1)
            top = grid_coords[valid].max(dim=0).values if valid.any() else torch.zeros(2, dtype=torch.long)
            map_size = (int(top[0]) + 1, int(top[1]) + 1)
    g = grid_coords.shape[0]
    bg = record.weights.shape[0]
    if bg % g != 0:
        raise ValueError(
            f"layer {record.name!r}: weights batch {bg} is not a multiple of {g} groups in token_coords"
        )
    prefix = torch.full((g, p, 2), -1, dtype=torch.long)
    coords = torch.cat([prefix, grid_coords], dim=1) if grid_coords.shape[1] < n else grid_coords
    hm, wm = map_size
    grid = (coords[..., 0] >= 0) & (coords[..., 1] >= 0) & (coords[..., 0] < hm) & (coords[..., 1] < wm)
    grid[:, :p] = False
    return TokenLayout(coords=coords, grid=grid, num_prefix_tokens=p, map_size=(hm, wm), num_groups=g)


def window_mask(layout: TokenLayout, k: int, device=None) -> torch.Tensor:
    """[G, N, N] bool: key j lies in the k x k window (image coordinates) centred on query i.

    Only grid tokens take part (prefix and padding rows and columns are all False); at the map's
    edges and corners the window is clipped, so it holds fewer than k*k keys.
    """
    if k < 1 or k % 2 == 0:
        raise ValueError(f"window size k must be an odd positive integer, got {k}")
    r = k // 2
    c = layout.coords
    d = (c[:, :, None, :] - c[:, None, :, :]).abs()  # [G, Nq, Nk, 2]
    near = (d[..., 0] <= r) & (d[..., 1] <= r)
    near &= layout.grid[:, :, None] & layout.grid[:, None, :]
    return near.to(device) if device is not None else near


def expand_groups(t: torch.Tensor, batch: int) -> torch.Tensor:
    """[G, ...] -> [B*G, ...] in the records' batch-major order (index b*G + g)."""
    return t.repeat(batch, *([1] * (t.dim() - 1)))
