"""Encoder-decoder segmentor (mmseg's ``EncoderDecoder``): backbone [+ neck] + decode head
[+ auxiliary head], cross-entropy training, whole-image and sliding-window inference.

Two recipes of the paper (and the functions that build them):

- ``semantic_fpn``: :class:`FPN` neck (256 channels) + :class:`FPNHead` (128 channels);
- ``upernet``: :class:`UPerHead` (512 channels, PPM bins 1-2-3-6) + :class:`FCNHead` auxiliary
  head on the stride-16 map (256 channels, loss weight 0.4).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .backbone import DenseBackbone
from .heads import FCNHead, FPN, FPNHead, UPerHead, resize
from .losses import SegLoss

__all__ = ["EncoderDecoder", "HeadLogits", "SegLogits", "build_segmentor", "slide_windows"]

DECODE_TYPES = ("semantic_fpn", "upernet")


class SegLogits(NamedTuple):
    """Every head's logits at the input size (:meth:`EncoderDecoder.head_logits`, what the training
    loss takes): the decode head's [B, K, H, W] and the auxiliary head's [B, K, H, W] (None where
    the model has no auxiliary loss)."""

    decode: torch.Tensor
    aux: Optional[torch.Tensor]


def slide_windows(h: int, w: int, crop: Sequence[int], stride: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """mmseg's sliding-window grid over an h x w image: (y1, y2, x1, x2) windows of at most
    ``crop`` size, ``stride`` apart, the last window of each row/column flush with the border.
    A stride larger than the crop is a ValueError (it would leave uncovered gaps)."""
    ch, cw = crop
    sh, sw = stride
    if min(ch, cw, sh, sw) <= 0:
        raise ValueError(f"crop {tuple(crop)} and stride {tuple(stride)} must be positive")
    if sh > ch or sw > cw:  # windows further apart than their size leave pixels no window covers
        raise ValueError(
            f"slide stride {tuple(stride)} is larger than the crop {tuple(crop)}: the pixels between windows "
            "would get no prediction; use a stride <= the crop (mmseg's ADE20K recipes: crop 512, stride 341)"
        )
    rows = max(h - ch + sh - 1, 0) // sh + 1
    cols = max(w - cw + sw - 1, 0) // sw + 1
    out = []
    for r in range(rows):
        for c in range(cols):
            y2, x2 = min(r * sh + ch, h), min(c * sw + cw, w)
            out.append((max(y2 - ch, 0), y2, max(x2 - cw, 0), x2))
    return out


class EncoderDecoder(nn.Module):
    """Backbone -> [neck] -> decode head (+ auxiliary head while training).

    Args:
        backbone: a :class:`DenseBackbone` (any module returning a list of NCHW maps with
            ``out_channels`` and ``strides`` attributes).
        decode_head: maps -> logits at the finest stride.
        neck: optional maps -> maps.
        aux_head: optional maps (the backbone's) -> logits; its loss is weighted by ``aux_weight``.
        num_classes, ignore_index: label space; pixels labelled ``ignore_index`` count nowhere.
        size_divisor: inputs are zero-padded (bottom/right) to a multiple of this before the
            backbone; logits are cropped back (so any input size works).
        align_corners: of the final upsampling to the input size (mmseg: False).
        avg_non_ignore: average the loss over non-ignored pixels only (mmseg's default, False,
            divides by every pixel of the label map).
    """

    def __init__(
        self,
        backbone: nn.Module,
        decode_head: nn.Module,
        *,
        neck: Optional[nn.Module] = None,
        aux_head: Optional[nn.Module] = None,
        aux_weight: float = 0.4,
        num_classes: int = 150,
        ignore_index: int = 255,
        size_divisor: int = 32,
        align_corners: bool = False,
        avg_non_ignore: bool = False,
    ):
        super().__init__()
        self.backbone, self.neck, self.decode_head, self.aux_head = backbone, neck, decode_head, aux_head
        self.aux_weight = float(aux_weight)
        self.num_classes, self.ignore_index = int(num_classes), int(ignore_index)
        self.size_divisor, self.align_corners = int(size_divisor), align_corners
        self.avg_non_ignore = avg_non_ignore
        # the training loss, also what a CUDA-graphed step applies to :class:`HeadLogits`' output
        self.criterion = SegLoss(num_classes, ignore_index, self.aux_weight, avg_non_ignore)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Full parameter names exempt from weight decay (the backbone's position embeddings,
        cls token, relative-position tables); norms and biases are exempt by shape anyway."""
        inner = self.backbone.no_weight_decay() if hasattr(self.backbone, "no_weight_decay") else set()
        return {"backbone." + n for n in inner}

    # ---- forward -------------------------------------------------------------------------

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"expected images [B, C, H, W], got shape {tuple(x.shape)}")
        d = self.size_divisor
        ph, pw = (-x.shape[2]) % d, (-x.shape[3]) % d
        return F.pad(x, (0, pw, 0, ph)) if ph or pw else x

    def extract(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Backbone maps of an already padded batch [B, C, H, W]."""
        return self.backbone(x)

    def _decode(self, feats: list[torch.Tensor]) -> torch.Tensor:
        return self.decode_head(self.neck(feats) if self.neck is not None else feats)

    def _to_input(self, logits: torch.Tensor, padded: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
        logits = resize(logits, padded, align_corners=self.align_corners)
        return logits[..., : size[0], : size[1]]

    def encode_decode(self, x: torch.Tensor) -> torch.Tensor:
        """images [B, C, H, W] -> logits [B, K, H, W] (decode head only)."""
        size = tuple(x.shape[-2:])
        xp = self._pad(x)
        return self._to_input(self._decode(self.extract(xp)), tuple(xp.shape[-2:]), size)

    def forward(self, x: torch.Tensor, target: Optional[torch.Tensor] = None):
        """images [B, C, H, W] -> the decode head's logits [B, K, H, W] (whole image), in training
        and in eval mode alike; with labels ``target`` [B, H, W], the loss dict of :meth:`loss`
        instead (so DDP sees the training pass). Every head's logits: :meth:`head_logits`."""
        if target is not None:
            return self.loss(x, target)
        return self.encode_decode(x)

    def head_logits(self, x: torch.Tensor) -> SegLogits:
        """images [B, C, H, W] -> the decode head's logits and the auxiliary head's (where its
        loss has a weight), each upsampled (bilinear) to the input size, as mmseg does before the
        cross-entropy."""
        size = tuple(x.shape[-2:])
        xp = self._pad(x)
        padded = tuple(xp.shape[-2:])
        feats = self.extract(xp)
        decode = self._to_input(self._decode(feats), padded, size)
        aux = None
        if self.aux_head is not None and self.aux_weight > 0:
            aux = self._to_input(self.aux_head(feats), padded, size)
        return SegLogits(decode, aux)

    def loss(self, x: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """images [B, C, H, W], labels [B, H, W] (int, ``ignore_index`` allowed) -> losses.

        Returns ``{"loss": total, "loss_decode": ..., ["loss_aux": ...]}`` (:meth:`SegLoss.terms`
        of :meth:`head_logits`, the labels' range checked).
        """
        if target.dim() != 3 or target.shape[0] != x.shape[0] or target.shape[-2:] != x.shape[-2:]:
            raise ValueError(f"labels {tuple(target.shape)} must be [B, H, W] matching images {tuple(x.shape)}")
        return self.criterion.terms(self.head_logits(x), target)

    @torch.no_grad()
    def slide_inference(self, x: torch.Tensor, crop: Sequence[int], stride: Sequence[int]) -> torch.Tensor:
        """images [B, C, H, W] -> logits [B, K, H, W], averaged over overlapping ``crop`` windows
        ``stride`` apart (mmseg's ``slide`` mode; images smaller than a crop are one window)."""
        b, _, h, w = x.shape
        acc = x.new_zeros((b, self.num_classes, h, w))
        count = x.new_zeros((1, 1, h, w))
        for y1, y2, x1, x2 in slide_windows(h, w, crop, stride):
            acc[:, :, y1:y2, x1:x2] += self.encode_decode(x[:, :, y1:y2, x1:x2])
            count[:, :, y1:y2, x1:x2] += 1
        return acc / count

    @torch.no_grad()
    def predict(
        self,
        x: torch.Tensor,
        *,
        mode: str = "whole",
        crop: Optional[Sequence[int]] = None,
        stride: Optional[Sequence[int]] = None,
        out_size: Optional[Sequence[int]] = None,
        flip: bool = False,
    ) -> torch.Tensor:
        """images [B, C, H, W] -> class scores [B, K, *out_size] (softmax probabilities).

        mode: "whole" (one pass) or "slide" (``crop`` windows ``stride`` apart).
        out_size: resize the scores (bilinear) to this size, e.g. the original image size.
        flip: average with the prediction of the left-right flipped image.
        """
        if mode == "whole":
            run = self.encode_decode
        elif mode == "slide":
            if crop is None or stride is None:
                raise ValueError("slide inference needs crop and stride, e.g. crop=(512, 512), stride=(341, 341)")
            run = lambda t: self.slide_inference(t, crop, stride)  # noqa: E731
        else:
            raise ValueError(f"inference mode {mode!r}: expected 'whole' or 'slide'")
        probs = run(x).softmax(dim=1)
        if flip:
            probs = (probs + run(x.flip(-1)).softmax(dim=1).flip(-1)) / 2
        if out_size is not None:
            probs = resize(probs, out_size, align_corners=self.align_corners)
        return probs


class HeadLogits(nn.Module):
    """A segmentor's every head as one forward: images [B, C, H, W] -> :class:`SegLogits`
    (:meth:`EncoderDecoder.head_logits`), what its :attr:`~EncoderDecoder.criterion` takes.

    What a CUDA-graphed segmentation step calls in place of the segmentor (the graphed step
    applies the task's criterion to its module's output), so the segmentor's own forward keeps one
    output in both modes. It holds the segmentor itself (``segmentor``): the same parameters and
    buffers, under that prefix.
    """

    def __init__(self, segmentor: EncoderDecoder):
        super().__init__()
        self.segmentor = segmentor

    def forward(self, x: torch.Tensor) -> SegLogits:
        return self.segmentor.head_logits(x)


def build_segmentor(
    decode: str,
    backbone: str,
    *,
    num_classes: int = 150,
    channels: Optional[int] = None,
    neck_channels: int = 256,
    aux_weight: Optional[float] = None,
    aux_channels: int = 256,
    aux_in_index: int = 2,
    pool_scales: Sequence[int] = (1, 2, 3, 6),
    dropout: float = 0.1,
    ignore_index: int = 255,
    align_corners: bool = False,
    avg_non_ignore: bool = False,
    backbone_kwargs: Optional[dict] = None,
) -> EncoderDecoder:
    """One of the paper's segmentors over a registered backbone.

    Args:
        decode: "semantic_fpn" (FPN neck ``neck_channels`` + FPNHead ``channels``, default 128;
            no auxiliary head unless ``aux_weight`` > 0) or "upernet" (UPerHead ``channels``,
            default 512, + FCN auxiliary head, ``aux_weight`` default 0.4).
        backbone: registered model name; ``backbone_kwargs`` go to :class:`DenseBackbone`
            (frozen_stages, norm_eval, drop_path_rate, pretrained, pattern, embed_dims, ...).
    """
    if decode not in DECODE_TYPES:
        raise ValueError(f"decode head {decode!r}: expected one of {DECODE_TYPES}")
    bb = DenseBackbone(backbone, **(backbone_kwargs or {}))
    if len(bb.out_channels) != 4:
        raise ValueError(f"the {decode} recipe needs the four backbone maps, got out_indices={bb.out_indices}")
    neck = None
    if decode == "semantic_fpn":
        neck = FPN(bb.out_channels, neck_channels)
        head = FPNHead([neck_channels] * 4, bb.strides, channels or 128, num_classes, dropout, align_corners)
        aux_weight = 0.0 if aux_weight is None else aux_weight
    else:
        head = UPerHead(bb.out_channels, channels or 512, num_classes, pool_scales, dropout, align_corners)
        aux_weight = 0.4 if aux_weight is None else aux_weight
    aux = None
    if aux_weight > 0:
        aux = FCNHead(bb.out_channels[aux_in_index], aux_channels, num_classes, aux_in_index, 1, dropout)
    return EncoderDecoder(
        bb,
        head,
        neck=neck,
        aux_head=aux,
        aux_weight=aux_weight,
        num_classes=num_classes,
        ignore_index=ignore_index,
        size_divisor=max(32, *bb.strides),
        align_corners=align_corners,
        avg_non_ignore=avg_non_ignore,
    )
