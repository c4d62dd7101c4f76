"""Patch embedding for images of any size, and the token <-> NCHW layout step that goes with it.

x: [B, C_in, H, W] -> tokens [B, Hp*Wp, C] and the grid (Hp, Wp); ``tokens_to_nchw`` turns grid
tokens back into a map.
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .common import to_2tuple

__all__ = ["PatchEmbed", "check_images", "pad_small_input", "tokens_to_nchw"]

_WARNED_SMALL: set[str] = set()


def pad_small_input(x: torch.Tensor, min_size: tuple[int, int], owner: str) -> torch.Tensor:
    """Zero-pad images ``[B, C, H, W]`` smaller than the stem's ``min_size`` at the bottom/right,
    warning once per ``owner`` (a model name): such an image becomes mostly padding."""
    pad_h, pad_w = max(0, min_size[0] - x.shape[-2]), max(0, min_size[1] - x.shape[-1])
    if not (pad_h or pad_w):
        return x
    if owner not in _WARNED_SMALL:
        _WARNED_SMALL.add(owner)
        warnings.warn(
            f"{owner}: input {tuple(x.shape[-2:])} is smaller than the stem's {tuple(min_size)}; "
            "it is zero-padded (warned once)",
            UserWarning,
            stacklevel=3,
        )
    return F.pad(x, (0, pad_w, 0, pad_h))


def check_images(x, in_chans: int, weight: torch.Tensor) -> None:
    """A model's input: images ``[B, in_chans, H, W]`` with H, W >= 1 (B = 0 is an empty batch), a
    floating tensor of the stem's ``weight`` dtype (any floating dtype under autocast, which casts
    it); a ValueError saying what to do otherwise."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"expected images as a torch.Tensor [B, {in_chans}, H, W], got {type(x).__name__}")
    if x.dim() != 4 or x.shape[1] != in_chans:
        raise ValueError(f"expected images [B, {in_chans}, H, W], got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(
            f"images of dtype {x.dtype}: convert them to floating point first (for 8-bit images "
            "x.float() / 255, then the model's normalisation: model.pretrained_cfg.mean and std)"
        )
    if x.dtype != weight.dtype and not (x.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(x.device.type)):
        raise ValueError(
            f"images of dtype {x.dtype} but the model's weights are {weight.dtype}: cast the images "
            f"(x.to({weight.dtype})) or the model (model.to({x.dtype}))"
        )
    if x.shape[2] == 0 or x.shape[3] == 0:
        raise ValueError(f"images of size {x.shape[2]}x{x.shape[3]}: expected at least one pixel on each side")


class PatchEmbed(nn.Module):
    """Non-overlapping patches: Conv2d(k = s = patch) [+ norm] on images of any size.

    Inputs whose sides the patch size does not divide are zero-padded at the bottom/right
    (the reference requires divisible sizes; at those sizes nothing changes); an image smaller
    than one patch (``is_stem``: the model's first layer) is padded too, with a warning (once
    per process).

    x: [B, C_in, H, W] -> tokens [B, Hp*Wp, C], (Hp, Wp).
    """

    def __init__(
        self,
        img_size=224,
        patch_size=16,
        in_chans: int = 3,
        embed_dim: int = 768,
        norm_layer: Optional[type] = None,
        is_stem: bool = True,
    ):
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
        ph, pw = self.patch_size
        if self.is_stem:
            check_images(x, self.proj.in_channels, self.proj.weight)
            x = pad_small_input(x, self.patch_size, type(self).__name__)
        elif x.dim() != 4 or x.shape[1] != self.proj.in_channels:
            raise ValueError(f"expected maps [B, {self.proj.in_channels}, H, W], got shape {tuple(x.shape)}")
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
