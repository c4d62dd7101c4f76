"""Small helpers shared by the model families: attention patterns, feature indices, position
embeddings, patch embedding with padding.

Pattern strings (the paper's notation, per stage): ``I`` = InLine, ``S`` = softmax as in the base
architecture, ``L`` = linear attention (ReLU kernel) laid out like InLine, ``M`` = mixed: with an
``M<n>`` suffix after the stage letters, the first n blocks of every M stage are InLine and the
rest softmax ("IIMS2", also written "IIMSM2").
"""
from __future__ import annotations

import re
import warnings
from typing import Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers import to_2tuple

PATTERN_KINDS = {"I": "inline", "S": "softmax", "L": "linear"}
# stage letters, then the optional mixed-stage block count: "IIMS2" or "IIMSM2"
_PATTERN_RE = re.compile(r"([ISLM]+?)(?:M?(\d+))?")


def parse_pattern(pattern: str, depths: Sequence[int]) -> list[list[str]]:
    """``pattern`` ("IIIS", "IIMS2", "I") -> per stage, per block attention kind.

    Raises ValueError naming the pattern when its letters do not match the number of stages or
    an M stage has no block count.
    """
    if not isinstance(pattern, str):
        raise ValueError(f"pattern must be a string such as 'IIIS', got {pattern!r}")
    m = _PATTERN_RE.fullmatch(pattern)
    letters, mixed = (m.group(1), m.group(2)) if m else (None, None)
    if letters is None or len(letters) != len(depths):
        raise ValueError(
            f"pattern {pattern!r} must give one of I/S/L/M per stage ({len(depths)} stages), "
            f"optionally followed by M<n>, e.g. {'I' * len(depths)!r}"
        )
    if "M" in letters and mixed is None:
        raise ValueError(f"pattern {pattern!r} marks a stage M but gives no M<n> block count")
    if "M" not in letters and mixed is not None:
        raise ValueError(f"pattern {pattern!r} gives a block count but marks no stage M")
    kinds = []
    for letter, depth in zip(letters, depths):
        if letter == "M":
            n = int(mixed)
            kinds.append(["inline" if j < n else "softmax" for j in range(depth)])
        else:
            kinds.append([PATTERN_KINDS[letter]] * depth)
    return kinds


def take_indices(num_features: int, indices: Union[None, int, Sequence[int]]) -> list[int]:
    """Resolve ``indices`` for ``forward_intermediates``: None = all, int n = the last n,
    a sequence = those (negative counts from the end). Returns sorted non-negative indices."""
    if indices is None:
        return list(range(num_features))
    if isinstance(indices, int):
        if not 0 < indices <= num_features:
            raise ValueError(f"indices={indices} must be in [1, {num_features}] (the last n)")
        return list(range(num_features - indices, num_features))
    out = []
    for i in indices:
        if not -num_features <= int(i) < num_features:
            raise ValueError(f"feature index {i} out of range for {num_features} features")
        out.append(int(i) % num_features)
    return sorted(set(out))


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


_WARNED_SMALL: set[str] = set()


def pad_small_input(x: torch.Tensor, min_size: tuple[int, int], owner: str) -> torch.Tensor:
    """Zero-pad images ``[B, C, H, W]`` smaller than the stem's ``min_size`` at the bottom/right,
    warning once per ``owner`` (a model name): such an image becomes mostly padding."""
    pad_h, pad_w = max(0, min_size[0] - x.shape[-2]), max(0, min_size[1] - x.shape[-1])
    if not (pad_h or pad_w):
        return x
    if owner not in _WARNED_SMALL:
        _WARNED_SMALL.add(owner)
        warnings.warn(f"{owner}: input {tuple(x.shape[-2:])} is smaller than the stem's {tuple(min_size)}; "
                      "it is zero-padded (warned once)", UserWarning, stacklevel=3)
    return F.pad(x, (0, pad_w, 0, pad_h))


class PatchEmbed(nn.Module):
    """Non-overlapping patches: Conv2d(k = s = patch) [+ norm] on images of any size.

    Inputs whose sides the patch size does not divide are zero-padded at the bottom/right
    (the reference requires divisible sizes; at those sizes nothing changes); an image smaller
    than one patch (``is_stem``: the model's first layer) is padded too, with a warning (once
    per process).

    x: [B, C_in, H, W] -> tokens [B, Hp*Wp, C], (Hp, Wp).
    """

    def __init__(self, img_size=224, patch_size=16, in_chans: int = 3, embed_dim: int = 768,
                 norm_layer: Optional[type] = None, is_stem: bool = True):
        super().__init__()
        self.is_stem = is_stem  # a model's first layer: an input smaller than a patch is worth a warning
        self.img_size = to_2tuple(img_size)
        self.patch_size = to_2tuple(patch_size)
        if min(self.patch_size) <= 0:
            raise ValueError(f"patch_size must be positive, got {patch_size!r}")
        if any(i < p for i, p in zip(self.img_size, self.patch_size)):
            raise ValueError(f"img_size {self.img_size} is smaller than patch_size {self.patch_size}")
        self.grid_size = (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size)
        self.norm = norm_layer(embed_dim) if norm_layer is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        if x.dim() != 4 or x.shape[1] != self.proj.in_channels:
            raise ValueError(
                f"expected images [B, {self.proj.in_channels}, H, W], got shape {tuple(x.shape)}"
            )
        ph, pw = self.patch_size
        if self.is_stem:
            x = pad_small_input(x, self.patch_size, type(self).__name__)
        pad_h, pad_w = (-x.shape[2]) % ph, (-x.shape[3]) % pw
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h))
        x = self.proj(x)  # [B, C, Hp, Wp]
        feat_size = (x.shape[2], x.shape[3])
        return self.norm(x.flatten(2).transpose(1, 2)), feat_size


def tokens_to_nchw(x: torch.Tensor, feat_size: tuple[int, int]) -> torch.Tensor:
    """x: [B, H*W, C] grid tokens -> [B, C, H, W] (contiguous)."""
    b, _, c = x.shape
    return x.transpose(1, 2).reshape(b, c, feat_size[0], feat_size[1]).contiguous()
