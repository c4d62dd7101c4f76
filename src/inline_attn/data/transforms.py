"""Batched augmentation on the training device (kornia) and the eval transform.

Input batches are uint8 (or float in [0, 1]) ``[B, C, H, W]``; outputs are normalised float
``[B, C, img_size, img_size]``. The training recipe follows the paper's (timm's) ImageNet
pipeline: random resized crop, horizontal flip, RandAugment, colour jitter (only without an
auto-augment policy, as timm does), normalisation, random erasing (per-pixel normal noise).
kornia's RandAugment ops are its own, not timm's ``rand-m9-mstd0.5`` ops: the policy string only
picks n (default 2) and m.
"""
from __future__ import annotations

import functools
import math
import re
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F


def parse_rand_augment(spec: str) -> tuple[int, int]:
    """``"rand-m9-mstd0.5-inc1"`` -> (n=2, m=9). Unknown fields (mstd, inc) are accepted and ignored."""
    parts = spec.split("-")
    if parts[0] != "rand":
        raise ValueError(f"auto_augment {spec!r}: only RandAugment policies 'rand-m<M>[-n<N>]...' are supported")
    n, m = 2, 9
    for p in parts[1:]:
        key = re.match(r"[a-z]+", p)
        if key is None:
            raise ValueError(f"auto_augment {spec!r}: cannot parse field {p!r}")
        val = p[key.end():]
        if key.group() == "m":
            m = int(float(val))
        elif key.group() == "n":
            n = int(val)
    return n, m


def to_float(x: torch.Tensor) -> torch.Tensor:
    """uint8 -> float32 in [0, 1]; float passes through."""
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()


class Normalize(nn.Module):
    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, x):
        return (x - self.mean) / self.std


def random_erasing(x: torch.Tensor, p: float, scale=(0.02, 1 / 3), ratio=(0.3, 3.3),
                   max_tries: int = 10) -> torch.Tensor:
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
    box = ((rows >= top.view(B, 1, 1)) & (rows < (top + h).view(B, 1, 1))
           & (cols >= left.view(B, 1, 1)) & (cols < (left + w).view(B, 1, 1)) & chosen.view(B, 1, 1))
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


def random_hflip(x: torch.Tensor, p: float) -> torch.Tensor:
    """Flip each image left-right with probability ``p``. x: [B, C, H, W]."""
    if p <= 0:
        return x
    flip = (torch.rand(x.shape[0]) < p).to(x.device).view(-1, 1, 1, 1)
    return torch.where(flip, x.flip(-1), x)


def _kornia(option: str):
    """kornia.augmentation, imported only by the options that need it (the pad crop, flips and
    erasing are written here), so light recipes run where kornia is not installed."""
    try:
        import kornia.augmentation as K
        from kornia.augmentation import auto  # noqa: F401  (K.auto)
    except ImportError as err:
        raise ValueError(f"aug.{option} needs kornia (pip install kornia): {err}") from None
    return K


class TrainAugment(nn.Module):
    """The training augmentation, applied to a whole batch on its device.

    Args:
        img_size: output side.
        mean, std: normalisation (one value per channel).
        crop: "rrc" (RandomResizedCrop with ``scale``/``ratio``), "pad" (random crop after
            zero padding by ``padding``, for small images) or "none" (resize only).
        hflip: flip probability.
        auto_augment: RandAugment policy string or None.
        color_jitter: brightness/contrast/saturation strength, used only without auto_augment.
        re_prob: random erasing probability.
    """

    def __init__(self, img_size: int, mean: Sequence[float], std: Sequence[float], *, crop: str = "rrc",
                 scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), padding: int = 4, hflip: float = 0.5,
                 auto_augment: Optional[str] = "rand-m9-mstd0.5-inc1", color_jitter: Optional[float] = 0.4,
                 re_prob: float = 0.25, interpolation: str = "bicubic"):
        super().__init__()
        size = (img_size, img_size)
        self.img_size = img_size
        resample = "BICUBIC" if interpolation == "bicubic" else "BILINEAR"
        if crop == "rrc":
            self.crop = _kornia("crop 'rrc'").RandomResizedCrop(size, scale=tuple(scale), ratio=tuple(ratio),
                                                                 resample=resample)
        elif crop == "pad":
            self.crop = functools.partial(random_pad_crop, padding=int(padding))
        elif crop == "none":
            self.crop = None
        else:
            raise ValueError(f"aug.crop={crop!r}: expected 'rrc', 'pad' or 'none'")
        self.hflip = float(hflip)
        self.rand_augment = None
        self.jitter = None
        if auto_augment:
            n, m = parse_rand_augment(auto_augment)
            self.rand_augment = _kornia("auto_augment").auto.RandAugment(n=n, m=m)
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
        gray = x.shape[1] == 1
        if gray and (self.rand_augment is not None or self.jitter is not None):
            x = x.expand(-1, 3, -1, -1)  # kornia's colour ops fail on 1 channel in some calls
        if self.rand_augment is not None:
            x = self.rand_augment(x)
        if self.jitter is not None:
            x = self.jitter(x)
        if gray and x.shape[1] == 3:
            x = x.mean(1, keepdim=True)
        x = self.normalize(x.clamp_(0, 1) if x.is_contiguous() else x.clamp(0, 1))
        return random_erasing(x, self.re_prob)


class EvalTransform(nn.Module):
    """Resize the shorter side to ``floor(img_size / crop_pct)``, centre-crop ``img_size``, normalise.

    Batches already at ``img_size`` (e.g. decoded by :class:`ImageFolder` in eval layout, or
    Fashion-MNIST at crop_pct 1) are only normalised.
    """

    def __init__(self, img_size: int, mean: Sequence[float], std: Sequence[float], crop_pct: float = 0.875,
                 interpolation: str = "bicubic"):
        super().__init__()
        self.img_size = img_size
        self.crop_pct = crop_pct
        self.mode = "bicubic" if interpolation == "bicubic" else "bilinear"
        self.normalize = Normalize(mean, std)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = to_float(x)
        H, W = x.shape[-2:]
        if (H, W) != (self.img_size, self.img_size):
            s = math.floor(self.img_size / self.crop_pct)
            scale = s / min(H, W)
            nh, nw = max(self.img_size, round(H * scale)), max(self.img_size, round(W * scale))
            if (nh, nw) != (H, W):
                x = F.interpolate(x, size=(nh, nw), mode=self.mode, align_corners=False, antialias=True).clamp_(0, 1)
            top, left = (nh - self.img_size) // 2, (nw - self.img_size) // 2
            x = x[..., top:top + self.img_size, left:left + self.img_size]
        return self.normalize(x)
