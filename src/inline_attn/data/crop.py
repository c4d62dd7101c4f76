"""Crops and resizes: timm's random resized crop and the evaluation resize, for Pillow images (in the
data loader) and for batches of tensors (on the device).

- :func:`rrc_box` / :func:`rrc_boxes`: timm 0.4.12's ``RandomResizedCropAndInterpolation.get_params``
  (ten tries at an area fraction in ``scale`` and a log-uniform aspect ratio in ``ratio``, a
  uniform position; else the centre crop at the nearest allowed ratio), for one image with a
  numpy generator or for a batch with torch's global generator;
- :func:`random_resized_crop_pil`: that crop of the whole decoded image, resized with Pillow
  (as timm/torchvision's ``resized_crop``); :func:`resized_crop`: the same on a batch of tensors;
- :func:`eval_resize_pil` / :func:`eval_resize`: the evaluation resize, ``"shorter"`` (timm: the
  shorter side to ``floor(size / crop_pct)``, aspect kept) or ``"squash"`` (the authors' Swin code
  base: the whole image to a square of side ``int(size / crop_pct)``), then the centre crop.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

RESAMPLE = {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR, "nearest": Image.NEAREST}
EVAL_RESIZE = ("shorter", "squash")
RRC_TRIES = 10


def _check_interpolation(interpolation: str) -> None:
    if interpolation not in RESAMPLE:
        raise ValueError(f"unknown interpolation {interpolation!r}: expected one of {sorted(RESAMPLE)}")


def rrc_box(
    rng: np.random.Generator, width: int, height: int, scale: Sequence[float], ratio: Sequence[float]
) -> tuple[int, int, int, int]:
    """One random resized crop box ``(top, left, h, w)`` of a ``width x height`` image."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(RRC_TRIES):
        target = rng.uniform(scale[0], scale[1]) * area
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    h, w = _fallback(width, height, ratio)
    return (height - h) // 2, (width - w) // 2, h, w


def _fallback(width: int, height: int, ratio: Sequence[float]) -> tuple[int, int]:
    """timm's fallback: the whole image, cut to the nearest allowed aspect ratio."""
    in_ratio = width / height
    if in_ratio < min(ratio):
        return int(round(width / min(ratio))), width
    if in_ratio > max(ratio):
        return height, int(round(height * max(ratio)))
    return height, width


def rrc_boxes(batch: int, height: int, width: int, scale: Sequence[float], ratio: Sequence[float]) -> torch.Tensor:
    """:func:`rrc_box` for ``batch`` images of one size, drawn with torch's global generator: [B, 4] int64."""
    area = width * height
    target = torch.empty(batch, RRC_TRIES, dtype=torch.float64).uniform_(scale[0], scale[1]) * area
    aspect = torch.exp(
        torch.empty(batch, RRC_TRIES, dtype=torch.float64).uniform_(math.log(ratio[0]), math.log(ratio[1]))
    )
    w = torch.round(torch.sqrt(target * aspect)).long()
    h = torch.round(torch.sqrt(target / aspect)).long()
    ok = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = torch.argmax(ok.int(), dim=1, keepdim=True)  # the first try that fits
    found = ok.any(dim=1)
    fh, fw = _fallback(width, height, ratio)
    h = torch.where(found, h.gather(1, first).squeeze(1), fh)
    w = torch.where(found, w.gather(1, first).squeeze(1), fw)
    top = torch.where(found, (torch.rand(batch, dtype=torch.float64) * (height - h + 1)).long(), (height - h) // 2)
    left = torch.where(found, (torch.rand(batch, dtype=torch.float64) * (width - w + 1)).long(), (width - w) // 2)
    return torch.stack([top, left, h, w], dim=1)


def random_resized_crop_pil(
    img: Image.Image,
    size: int,
    rng: np.random.Generator,
    scale: Sequence[float],
    ratio: Sequence[float],
    interpolation: str = "bicubic",
) -> Image.Image:
    """timm's RandomResizedCropAndInterpolation on a Pillow image: a ``size x size`` image."""
    _check_interpolation(interpolation)
    top, left, h, w = rrc_box(rng, img.width, img.height, scale, ratio)
    # crop, then resize (torchvision's resized_crop); resize(box=...) would filter across the box's edge
    return img.crop((left, top, left + w, top + h)).resize((size, size), RESAMPLE[interpolation])


def resized_crop(x: torch.Tensor, boxes: torch.Tensor, size: int, interpolation: str = "bicubic") -> torch.Tensor:
    """x: [B, C, H, W] float; boxes: [B, 4] ``(top, left, h, w)`` -> [B, C, size, size], each box
    resized with antialiasing (as Pillow); one resize call per image."""
    mode = "bicubic" if interpolation == "bicubic" else "bilinear"
    out = []
    for b, (top, left, h, w) in enumerate(boxes.tolist()):
        crop = x[b : b + 1, :, top : top + h, left : left + w]
        out.append(F.interpolate(crop, size=(size, size), mode=mode, align_corners=False, antialias=True))
    return torch.cat(out)


def centre_offset(length: int, crop: int) -> int:
    """torchvision's CenterCrop offset: ``int(round((length - crop) / 2))``."""
    return int(round((length - crop) / 2.0))


def eval_size(img_size: int, crop_pct: float) -> int:
    """The side the evaluation resize aims at: ``floor(img_size / crop_pct)``; at crop_pct 0.875
    this is the authors' ``int(256 / 224 * img_size)``."""
    return math.floor(img_size / crop_pct)


def _resized_shape(height: int, width: int, img_size: int, crop_pct: float, mode: str) -> tuple[int, int]:
    s = eval_size(img_size, crop_pct)
    if mode == "squash":
        return max(s, img_size), max(s, img_size)
    if mode != "shorter":
        raise ValueError(f"eval resize {mode!r}: expected one of {EVAL_RESIZE}")
    # torchvision's Resize(int): the shorter side to s, the longer scaled and truncated
    if height <= width:
        return s, max(img_size, int(s * width / height))
    return max(img_size, int(s * height / width)), s


def eval_resize_pil(
    img: Image.Image, img_size: int, crop_pct: float, mode: str = "shorter", interpolation: str = "bicubic"
) -> Image.Image:
    """The evaluation resize of a Pillow image, then the centre ``img_size`` square."""
    _check_interpolation(interpolation)
    nh, nw = _resized_shape(img.height, img.width, img_size, crop_pct, mode)
    if (nw, nh) != img.size:
        img = img.resize((nw, nh), RESAMPLE[interpolation])
    top, left = centre_offset(nh, img_size), centre_offset(nw, img_size)
    return img.crop((left, top, left + img_size, top + img_size))


def eval_resize(
    x: torch.Tensor, img_size: int, crop_pct: float, mode: str = "shorter", interpolation: str = "bicubic"
) -> torch.Tensor:
    """:func:`eval_resize_pil` for a batch [B, C, H, W] in [0, 1] (antialiased, clamped)."""
    H, W = x.shape[-2:]
    nh, nw = _resized_shape(H, W, img_size, crop_pct, mode)
    if (nh, nw) != (H, W):
        x = F.interpolate(
            x,
            size=(nh, nw),
            mode="bicubic" if interpolation == "bicubic" else "bilinear",
            align_corners=False,
            antialias=True,
        ).clamp_(0, 1)
    top, left = centre_offset(nh, img_size), centre_offset(nw, img_size)
    return x[..., top : top + img_size, left : left + img_size]
