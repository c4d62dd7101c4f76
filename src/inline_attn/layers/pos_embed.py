"""Resizing learned position embeddings to another patch grid."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["resize_pos_embed"]


def resize_pos_embed(pos: torch.Tensor, old_size: tuple[int, int], new_size: tuple[int, int]) -> torch.Tensor:
    """pos: [1, Hold*Wold, C] grid embedding -> [1, Hnew*Wnew, C], bilinear (align_corners=False),
    as the reference resizes its embeddings. Returned unchanged when the sizes agree."""
    old_size, new_size = tuple(old_size), tuple(new_size)
    if old_size == new_size:
        return pos
    c = pos.shape[-1]
    grid = pos.reshape(1, old_size[0], old_size[1], c).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=new_size, mode="bilinear", align_corners=False)
    return grid.flatten(2).transpose(1, 2)
