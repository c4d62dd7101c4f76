"""Batched augmentation on the training device, and the eval transform.

Input batches are uint8 (or float in [0, 1]) ``[B, C, H, W]``; outputs are normalised float
``[B, C, img_size, img_size]``. The training recipe follows the paper's (timm's) ImageNet
pipeline, each random choice drawn per image: random resized crop (done by the data loader for
image folders, here for in-memory datasets), horizontal flip, RandAugment (timm's operations,
:mod:`inline_attn.data.rand_augment`) or colour jitter (only without RandAugment, as timm),
normalisation, random erasing (per-pixel normal noise).
"""

from __future__ import annotations

import functools
import math
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .crop import EVAL_RESIZE, eval_resize, resized_crop, rrc_boxes
from .rand_augment import RandAugment, parse_rand_augment


def to_float(x: torch.Tensor) -> torch.Tensor:
    """uint8 -> float32 in [0, 1]; float passes through."""
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()


class Normalize(nn.Module):
    """images [B, C, H, W] -> ``(x - mean) / std`` per channel (the scale of mean / std is the
    images': 0-1 for classification, 0-255 for the dense tasks)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, x):
        return (x - self.mean) / self.std


def random_erasing(
    x: torch.Tensor, p: float, scale=(0.02, 1 / 3), ratio=(0.3, 3.3), max_tries: int = 10
) -> torch.Tensor:
    """timm's RandomErasing in 'pixel' mode (one box per image, filled with N(0, 1) noise).

    x: [B, C, H, W], normalised. Each image is erased with probability ``p``.
    """
    if p <= 0:
        return x
    B, C, H, W = x.shape
    dev = x.device
    area = H * W
    chosen = torch.rand(B) < p
    # sample a box per image; retry until it fits (vectorised over images)
    h = torch.zeros(B, dtype=torch.long)
    w = torch.zeros(B, dtype=torch.long)
    ok = torch.zeros(B, dtype=torch.bool)
    log_r = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(max_tries):
        ta = torch.empty(B).uniform_(*scale) * area
        ar = torch.exp(torch.empty(B).uniform_(*log_r))
        th = torch.sqrt(ta * ar).round().long()
        tw = torch.sqrt(ta / ar).round().long()
        fits = (th < H) & (tw < W) & (th > 0) & (tw > 0) & ~ok
        h = torch.where(fits, th, h)
        w = torch.where(fits, tw, w)
        ok |= fits
    chosen &= ok
    if not chosen.any():
        return x
    top = (torch.rand(B) * (H - h + 1).float()).long()
    left = (torch.rand(B) * (W - w + 1).float()).long()
    rows = torch.arange(H).view(1, H, 1)
    cols = torch.arange(W).view(1, 1, W)
    box = (
        (rows >= top.view(B, 1, 1))
        & (rows < (top + h).view(B, 1, 1))
        & (cols >= left.view(B, 1, 1))
        & (cols < (left + w).view(B, 1, 1))
        & chosen.view(B, 1, 1)
    )
    noise = torch.randn(B, C, H, W).to(dev, x.dtype)
    return torch.where(box.unsqueeze(1).to(dev), noise, x)


def random_pad_crop(x: torch.Tensor, padding: int) -> torch.Tensor:
    """Zero-pad by ``padding`` and crop back to the input size at a random offset per image.

    x: [B, C, H, W]. Vectorised gather (kornia's per-sample crop costs more than a small model's
    step on 28 x 28 images).
    """
    if padding <= 0:
        return x
    B, C, H, W = x.shape
    xp = F.pad(x, (padding, padding, padding, padding))
    oy = torch.randint(0, 2 * padding + 1, (B,)).to(x.device)
    ox = torch.randint(0, 2 * padding + 1, (B,)).to(x.device)
    Wp = W + 2 * padding
    rows = (oy.view(B, 1, 1, 1) + torch.arange(H, device=x.device).view(1, 1, H, 1)).expand(B, C, H, Wp)
    cols = (ox.view(B, 1, 1, 1) + torch.arange(W, device=x.device).view(1, 1, 1, W)).expand(B, C, H, W)
    return xp.gather(2, rows).gather(3, cols)


def resize_pad_crop(x: torch.Tensor, img_size: int, padding: int, interpolation: str = "bicubic") -> torch.Tensor:
    """torchvision's ``Resize((img_size, img_size))`` then ``RandomCrop(img_size, padding=padding)``
    for a batch: images of another size are first resized whole to ``img_size`` square (antialiased,
    as the evaluation's resize at crop_pct 1), then :func:`random_pad_crop`. x: [B, C, H, W] in [0, 1]."""
    if x.shape[-2:] != (img_size, img_size):
        x = eval_resize(x, img_size, 1.0, "squash", interpolation)
    return random_pad_crop(x, padding)


def random_hflip(x: torch.Tensor, p: float) -> torch.Tensor:
    """Flip each image left-right with probability ``p``. x: [B, C, H, W]."""
    if p <= 0:
        return x
    flip = (torch.rand(x.shape[0]) < p).to(x.device).view(-1, 1, 1, 1)
    return torch.where(flip, x.flip(-1), x)


def _kornia(option: str):
    """kornia.augmentation, imported only by colour jitter (everything else is written here), so
    the recipes run where kornia is not installed."""
    try:
        import kornia.augmentation as K
    except ImportError as err:
        raise ValueError(f"aug.{option} needs kornia (pip install kornia): {err}") from None
    return K


class RandomResizedCrop(nn.Module):
    """timm's random resized crop for a batch of in-memory images, a box per image
    (:func:`~inline_attn.data.crop.rrc_boxes`), each resized with antialiasing."""

    def __init__(self, size: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), interpolation: str = "bicubic"):
        super().__init__()
        self.size, self.scale, self.ratio, self.interpolation = size, tuple(scale), tuple(ratio), interpolation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        boxes = rrc_boxes(x.shape[0], x.shape[-2], x.shape[-1], self.scale, self.ratio)
        return resized_crop(x, boxes, self.size, self.interpolation).clamp_(0, 1)


class TrainAugment(nn.Module):
    """The training augmentation, applied to a whole batch on its device, every image drawing its own.

    Args:
        img_size: output side.
        mean, std: normalisation (one value per channel).
        crop: "rrc" (random resized crop with ``scale``/``ratio``; for image folders the loader
            crops already and this is "none"), "pad" (:func:`resize_pad_crop`: images of another
            size resized whole to ``img_size``, then zero-padded by ``padding`` and randomly
            cropped back to ``img_size``; for small images) or "none" (resize only, when the size
            differs).
        hflip: flip probability.
        auto_augment: RandAugment policy string (``"rand-m9-mstd0.5-inc1"``) or None.
        color_jitter: brightness/contrast/saturation strength, used only without auto_augment.
        re_prob: random erasing probability.
        interpolation: resampling of the crop and of RandAugment's geometric operations.
    """

    def __init__(
        self,
        img_size: int,
        mean: Sequence[float],
        std: Sequence[float],
        *,
        crop: str = "rrc",
        scale=(0.08, 1.0),
        ratio=(3 / 4, 4 / 3),
        padding: int = 4,
        hflip: float = 0.5,
        auto_augment: Optional[str] = "rand-m9-mstd0.5-inc1",
        color_jitter: Optional[float] = 0.4,
        re_prob: float = 0.25,
        interpolation: str = "bicubic",
    ):
        super().__init__()
        self.img_size = img_size
        if crop == "rrc":
            self.crop = RandomResizedCrop(img_size, scale, ratio, interpolation)
        elif crop == "pad":
            self.crop = functools.partial(
                resize_pad_crop, img_size=img_size, padding=int(padding), interpolation=interpolation
            )
        elif crop == "none":
            self.crop = None
        else:
            raise ValueError(f"aug.crop={crop!r}: expected 'rrc', 'pad' or 'none'")
        self.hflip = float(hflip)
        self.rand_augment = None
        self.jitter = None
        if auto_augment:
            # RandAugment's geometric operations take bicubic or bilinear (timm: the data's interpolation)
            ra_interp = interpolation if interpolation in ("bicubic", "bilinear") else "bilinear"
            self.rand_augment = RandAugment(parse_rand_augment(auto_augment), mean, ra_interp)
        elif color_jitter:
            cj = float(color_jitter)
            self.jitter = _kornia("color_jitter").ColorJitter(cj, cj, cj, 0.0, p=1.0)
        self.normalize = Normalize(mean, std)
        self.re_prob = float(re_prob)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = to_float(x)
        if self.crop is not None:
            x = self.crop(x)
        elif x.shape[-2:] != (self.img_size, self.img_size):
            x = F.interpolate(x, size=(self.img_size, self.img_size), mode="bilinear", align_corners=False)
        x = random_hflip(x, self.hflip)
        if self.rand_augment is not None:  # timm's operations work on 8-bit levels
            x = self.rand_augment(torch.round(x.clamp(0, 1) * 255)).div_(255)
        if self.jitter is not None:
            gray = x.shape[1] == 1
            if gray:
                x = x.expand(-1, 3, -1, -1)  # kornia's colour ops fail on 1 channel in some calls
            x = self.jitter(x)
            if gray:
                x = x.mean(1, keepdim=True)
        x = self.normalize(x.clamp_(0, 1) if x.is_contiguous() else x.clamp(0, 1))
        return random_erasing(x, self.re_prob)


class EvalTransform(nn.Module):
    """The evaluation resize (:func:`~inline_attn.data.crop.eval_resize`: ``resize="shorter"``, the
    shorter side to ``floor(img_size / crop_pct)``, or ``"squash"``, the whole image to that square),
    the centre ``img_size`` crop, normalisation.

    Batches already at ``img_size`` (decoded by :class:`ImageFolder` in eval layout, or
    Fashion-MNIST at crop_pct 1) are only normalised.
    """

    def __init__(
        self,
        img_size: int,
        mean: Sequence[float],
        std: Sequence[float],
        crop_pct: float = 0.875,
        interpolation: str = "bicubic",
        resize: str = "shorter",
    ):
        super().__init__()
        if resize not in EVAL_RESIZE:
            raise ValueError(f"eval resize {resize!r}: expected one of {EVAL_RESIZE}")
        self.img_size = img_size
        self.crop_pct = crop_pct
        self.interpolation = interpolation
        self.resize = resize
        self.normalize = Normalize(mean, std)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = to_float(x)
        if x.shape[-2:] != (self.img_size, self.img_size):
            x = eval_resize(x, self.img_size, self.crop_pct, self.resize, self.interpolation)
        return self.normalize(x)
