"""Segmentation necks and heads with mmseg's layouts (so parameter counts agree with mmseg's).

- :class:`FPN` (mmseg ``FPN`` neck): 1x1 lateral convs and 3x3 output convs, with biases and no
  norm; top-down addition of nearest-upsampled coarser laterals.
- :class:`FPNHead` (mmseg ``FPNHead``, the head of Semantic FPN, Kirillov et al. 2019): per level,
  ``max(1, log2(s_i / s_0))`` conv-BN-ReLU 3x3 blocks, each followed by a 2x bilinear upsampling
  for the coarser levels; the levels are summed at stride s_0.
- :class:`UPerHead` (mmseg ``UPerHead``, UperNet, Xiao et al. 2018): a pyramid pooling module on
  the last map (bins 1, 2, 3, 6), an FPN over the others with bilinear top-down fusion, all
  levels resized to the finest and fused by a 3x3 conv.
- :class:`FCNHead` (mmseg ``FCNHead``): the auxiliary head on one map (one 3x3 conv-BN-ReLU).

Every head ends with dropout (p = 0.1) and a 1x1 classifier ``conv_seg``. All maps are NCHW.
Written from the papers and mmseg's documented semantics, not copied.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["ConvBNReLU", "FCNHead", "FPN", "FPNHead", "PPM", "UPerHead", "resize"]


def resize(x: torch.Tensor, size, mode: str = "bilinear", align_corners: bool = False) -> torch.Tensor:
    """x: [B, C, h, w] -> [B, C, *size] (returned unchanged when the size already agrees)."""
    size = tuple(int(s) for s in size)
    if tuple(x.shape[-2:]) == size:
        return x
    if mode == "nearest":
        return F.interpolate(x, size=size, mode="nearest")
    return F.interpolate(x, size=size, mode=mode, align_corners=align_corners)


class ConvBNReLU(nn.Sequential):
    """Conv2d (no bias) -> BatchNorm2d -> ReLU, mmseg's ``ConvModule`` with BN and ReLU.

    x: [B, C_in, H, W] -> [B, C_out, H', W'] (padding k // 2: same size at stride 1).
    """

    def __init__(self, c_in: int, c_out: int, kernel_size: int = 3):
        super().__init__(
            nn.Conv2d(c_in, c_out, kernel_size, padding=kernel_size // 2, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
        )


class _ClassifierMixin(nn.Module):
    """Dropout + 1x1 ``conv_seg`` classifier (mmseg's ``BaseDecodeHead.cls_seg``)."""

    def _init_classifier(self, channels: int, num_classes: int, dropout: float) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.num_classes = num_classes
        self.dropout = nn.Dropout2d(dropout) if dropout > 0 else nn.Identity()
        self.conv_seg = nn.Conv2d(channels, num_classes, 1)
        nn.init.normal_(self.conv_seg.weight, std=0.01)
        nn.init.zeros_(self.conv_seg.bias)

    def cls_seg(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, channels, H, W] -> logits [B, num_classes, H, W]."""
        return self.conv_seg(self.dropout(x))


class FPN(nn.Module):
    """Feature pyramid neck: maps [B, C_i, H_i, W_i] -> [B, out_channels, H_i, W_i], one per input.

    ``lateral_convs[i]``: 1x1 conv C_i -> out (bias); ``fpn_convs[i]``: 3x3 conv out -> out (bias).
    Coarser laterals are upsampled (nearest) to the finer one's size and added, coarse to fine.
    """

    def __init__(self, in_channels: Sequence[int], out_channels: int = 256):
        super().__init__()
        self.in_channels, self.out_channels = list(in_channels), out_channels
        self.lateral_convs = nn.ModuleList([nn.Conv2d(c, out_channels, 1) for c in in_channels])
        self.fpn_convs = nn.ModuleList([nn.Conv2d(out_channels, out_channels, 3, padding=1) for _ in in_channels])
        for m in self.modules():  # mmcv's ConvModule default init: Xavier-uniform, zero bias
            if isinstance(m, nn.Conv2d):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, feats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if len(feats) != len(self.in_channels):
            raise ValueError(f"FPN expects {len(self.in_channels)} maps, got {len(feats)}")
        laterals = [conv(f) for conv, f in zip(self.lateral_convs, feats)]
        for i in range(len(laterals) - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + resize(laterals[i], laterals[i - 1].shape[-2:], mode="nearest")
        return [conv(lat) for conv, lat in zip(self.fpn_convs, laterals)]


class FPNHead(_ClassifierMixin):
    """Semantic FPN's head. feats: maps at ``feature_strides`` (all ``in_channels[i]`` channels)
    -> logits [B, num_classes, H_0, W_0] at the finest stride.

    Level i has ``max(1, log2(s_i) - log2(s_0))`` ConvBNReLU 3x3 blocks (``channels`` wide), each
    followed by a 2x bilinear upsampling when s_i > s_0; the levels are summed (each resized to
    the finest map's size, which matters only for sides the strides do not divide).
    """

    def __init__(
        self,
        in_channels: Sequence[int],
        feature_strides: Sequence[int],
        channels: int = 128,
        num_classes: int = 150,
        dropout: float = 0.1,
        align_corners: bool = False,
    ):
        super().__init__()
        if len(in_channels) != len(feature_strides):
            raise ValueError(
                f"in_channels {tuple(in_channels)} and feature_strides {tuple(feature_strides)} "
                f"must have the same length"
            )
        if list(feature_strides) != sorted(feature_strides):
            raise ValueError(f"feature_strides {tuple(feature_strides)} must increase")
        self.feature_strides, self.align_corners = list(feature_strides), align_corners
        self.scale_heads = nn.ModuleList()
        s0 = feature_strides[0]
        for c_in, s in zip(in_channels, feature_strides):
            n = max(1, int(math.log2(s) - math.log2(s0)))
            layers: list[nn.Module] = []
            for k in range(n):
                layers.append(ConvBNReLU(c_in if k == 0 else channels, channels, 3))
                if s != s0:
                    layers.append(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=align_corners))
            self.scale_heads.append(nn.Sequential(*layers))
        self._init_classifier(channels, num_classes, dropout)

    def forward(self, feats: Sequence[torch.Tensor]) -> torch.Tensor:
        out = self.scale_heads[0](feats[0])
        for head, f in zip(self.scale_heads[1:], feats[1:]):
            out = out + resize(head(f), out.shape[-2:], align_corners=self.align_corners)
        return self.cls_seg(out)


class PPM(nn.ModuleList):
    """Pyramid pooling: x [B, C, H, W] -> list of [B, channels, H, W], one per bin size
    (adaptive average pool to bins x bins, ConvBNReLU 1x1, bilinear resize back)."""

    def __init__(self, pool_scales: Sequence[int], in_channels: int, channels: int, align_corners: bool = False):
        super().__init__(
            [nn.Sequential(nn.AdaptiveAvgPool2d(s), ConvBNReLU(in_channels, channels, 1)) for s in pool_scales]
        )
        self.align_corners = align_corners

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [resize(stage(x), x.shape[-2:], align_corners=self.align_corners) for stage in self]


class UPerHead(_ClassifierMixin):
    """UperNet's head. feats: maps [B, in_channels[i], H_i, W_i], finest first ->
    logits [B, num_classes, H_0, W_0].

    PPM on the last map, concatenated with it and fused by a 3x3 ConvBNReLU (``bottleneck``);
    1x1 ``lateral_convs`` on the others; top-down bilinear addition; 3x3 ``fpn_convs`` on all but
    the last; everything resized to the finest map, concatenated, fused by ``fpn_bottleneck``.
    """

    def __init__(
        self,
        in_channels: Sequence[int],
        channels: int = 512,
        num_classes: int = 150,
        pool_scales: Sequence[int] = (1, 2, 3, 6),
        dropout: float = 0.1,
        align_corners: bool = False,
    ):
        super().__init__()
        in_channels = list(in_channels)
        self.align_corners = align_corners
        self.psp_modules = PPM(pool_scales, in_channels[-1], channels, align_corners)
        self.bottleneck = ConvBNReLU(in_channels[-1] + len(pool_scales) * channels, channels, 3)
        self.lateral_convs = nn.ModuleList([ConvBNReLU(c, channels, 1) for c in in_channels[:-1]])
        self.fpn_convs = nn.ModuleList([ConvBNReLU(channels, channels, 3) for _ in in_channels[:-1]])
        self.fpn_bottleneck = ConvBNReLU(len(in_channels) * channels, channels, 3)
        self._init_classifier(channels, num_classes, dropout)

    def forward(self, feats: Sequence[torch.Tensor]) -> torch.Tensor:
        x = feats[-1]
        laterals = [conv(f) for conv, f in zip(self.lateral_convs, feats)]
        laterals.append(self.bottleneck(torch.cat([x, *self.psp_modules(x)], dim=1)))
        for i in range(len(laterals) - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + resize(
                laterals[i], laterals[i - 1].shape[-2:], align_corners=self.align_corners
            )
        outs = [conv(lat) for conv, lat in zip(self.fpn_convs, laterals[:-1])] + [laterals[-1]]
        size = outs[0].shape[-2:]
        outs = [outs[0]] + [resize(o, size, align_corners=self.align_corners) for o in outs[1:]]
        return self.cls_seg(self.fpn_bottleneck(torch.cat(outs, dim=1)))


class FCNHead(_ClassifierMixin):
    """The auxiliary head: ``feats[in_index]`` [B, in_channels, H, W] -> logits [B, K, H, W]
    through ``num_convs`` ConvBNReLU 3x3 blocks (no concatenation of the input)."""

    def __init__(
        self,
        in_channels: int,
        channels: int = 256,
        num_classes: int = 150,
        in_index: int = 2,
        num_convs: int = 1,
        dropout: float = 0.1,
    ):
        super().__init__()
        if num_convs < 1:
            raise ValueError(f"num_convs must be >= 1, got {num_convs}")
        self.in_index = in_index
        self.convs = nn.Sequential(
            *[ConvBNReLU(in_channels if k == 0 else channels, channels, 3) for k in range(num_convs)]
        )
        self._init_classifier(channels, num_classes, dropout)

    def forward(self, feats: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.cls_seg(self.convs(feats[self.in_index]))
