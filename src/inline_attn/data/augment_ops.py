"""The image operations of timm's RandAugment, on batches of tensors, with Pillow's arithmetic.

timm applies each RandAugment operation with Pillow to one 8-bit image. The functions here apply
the same operations to a batch ``x: [B, C, H, W]`` of float tensors holding 8-bit levels (whole
numbers in 0..255), with one parameter per image (``[B]`` tensors), on the batch's device, and
round every result as Pillow does, so each output is again a whole level:

- look-up-table operations (``invert``, ``posterize``, ``solarize``, ``solarize_add``,
  ``autocontrast``, ``equalize``): Pillow's tables (``PIL.ImageOps``), built per image and channel;
- enhancements (``color``, ``contrast``, ``brightness``, ``sharpness``): ``PIL.ImageEnhance``, a
  blend with a degenerate image (grey, mean grey, black, smoothed), truncated to 8 bits as
  ``Image.blend`` does;
- ``affine``: ``Image.transform(AFFINE)``: output pixel centres ``(x + 0.5, y + 0.5)`` map to input
  coordinates; a source outside the image takes ``fill``; bicubic sampling is Pillow's geometric
  cubic (Keys' kernel with a = -1, edge pixels repeated), computed in float64 as Pillow does and
  truncated.

Grey images (C = 1) are Pillow's "L" mode (``color`` leaves them unchanged).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

LEVELS = 256  # 8-bit images


def _per_image(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A ``[B]`` parameter as ``[B, 1, 1, 1]`` in x's dtype and device."""
    return v.to(device=x.device, dtype=x.dtype).view(-1, 1, 1, 1)


def apply_lut(x: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """x: [B, C, H, W] levels; lut: [B, C, 256] (or [B, 1, 256], shared by the channels) -> x mapped."""
    B, C, H, W = x.shape
    idx = x.reshape(B, C, H * W).long()
    lut = lut.to(device=x.device, dtype=x.dtype).expand(B, C, LEVELS)
    return lut.gather(2, idx).view(B, C, H, W)


def _levels(B: int, device) -> torch.Tensor:
    return torch.arange(LEVELS, device=device, dtype=torch.float64).expand(B, LEVELS)


def invert(x: torch.Tensor) -> torch.Tensor:
    """ImageOps.invert: 255 - v."""
    return (LEVELS - 1) - x


def posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """ImageOps.posterize: keep the ``bits`` [B] most significant bits (8 or more: unchanged)."""
    drop = (8 - bits.clamp(0, 8)).to(torch.float64)  # low bits cleared: v & ~(2**drop - 1)
    step = torch.pow(2.0, drop).unsqueeze(1)
    lut = torch.floor(_levels(bits.shape[0], bits.device) / step) * step
    return apply_lut(x, lut.unsqueeze(1))


def solarize(x: torch.Tensor, thresh: torch.Tensor) -> torch.Tensor:
    """ImageOps.solarize: levels at or above ``thresh`` [B] are inverted."""
    lv = _levels(thresh.shape[0], thresh.device)
    lut = torch.where(lv < thresh.to(torch.float64).unsqueeze(1), lv, (LEVELS - 1) - lv)
    return apply_lut(x, lut.unsqueeze(1))


def solarize_add(x: torch.Tensor, add: torch.Tensor, thresh: int = 128) -> torch.Tensor:
    """timm's solarize_add: levels below ``thresh`` get ``add`` [B] added (capped at 255)."""
    lv = _levels(add.shape[0], add.device)
    lut = torch.where(lv < thresh, (lv + add.to(torch.float64).unsqueeze(1)).clamp(max=LEVELS - 1), lv)
    return apply_lut(x, lut.unsqueeze(1))


def _histogram(x: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] levels -> [B, C, 256] int64 counts."""
    B, C, H, W = x.shape
    idx = x.reshape(B, C, H * W).long()
    return torch.zeros(B, C, LEVELS, dtype=torch.int64, device=x.device).scatter_add_(2, idx, torch.ones_like(idx))


def autocontrast(x: torch.Tensor) -> torch.Tensor:
    """ImageOps.autocontrast (cutoff 0): per channel, stretch [lowest, highest] level to [0, 255]."""
    hist = _histogram(x) > 0
    lv = torch.arange(LEVELS, device=x.device)
    lo = torch.where(hist, lv, LEVELS).amin(-1, keepdim=True).to(torch.float64)
    hi = torch.where(hist, lv, -1).amax(-1, keepdim=True).to(torch.float64)
    flat = hi <= lo  # a single level: Pillow leaves the channel as it is
    span = torch.where(flat, 1.0, hi - lo)
    scale = torch.full_like(span, LEVELS - 1) / span  # a true division (``255 / t`` multiplies by 1 / t)
    offset = -lo * scale
    lut = torch.trunc(lv.to(torch.float64) * scale + offset).clamp(0, LEVELS - 1)  # int() in Pillow
    lut = torch.where(flat, lv.to(torch.float64), lut)
    return apply_lut(x, lut)


def equalize(x: torch.Tensor) -> torch.Tensor:
    """ImageOps.equalize: per channel, Pillow's integer histogram equalisation."""
    hist = _histogram(x)
    nonzero = hist > 0
    lv = torch.arange(LEVELS, device=x.device)
    last = torch.where(nonzero, lv, -1).amax(-1, keepdim=True)  # highest level present
    step = (hist.sum(-1, keepdim=True) - hist.gather(-1, last.clamp(min=0))) // (LEVELS - 1)
    keep = (nonzero.sum(-1, keepdim=True) <= 1) | (step == 0)  # Pillow leaves such a channel unchanged
    step = torch.where(keep, 1, step)
    before = torch.cumsum(hist, -1) - hist  # pixels strictly below each level
    lut = ((step // 2 + before) // step).clamp(max=LEVELS - 1)
    lut = torch.where(keep, lv, lut)
    return apply_lut(x, lut)


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """Pillow's RGB -> L conversion, in its fixed point: [B, 3, H, W] -> [B, 1, H, W] (grey passes)."""
    if x.shape[1] == 1:
        return x
    q = x.to(torch.int64)
    grey = (q[:, 0:1] * 19595 + q[:, 1:2] * 38470 + q[:, 2:3] * 7471 + 0x8000) >> 16
    return grey.to(x.dtype)


def blend(degenerate: torch.Tensor, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Image.blend(degenerate, x, factor): ``degenerate + factor * (x - degenerate)`` in float32,
    truncated to a level and clipped to [0, 255] (``factor`` [B] may leave [0, 1])."""
    f = _per_image(factor.to(torch.float32), x.float())
    out = degenerate.float() + f * (x.float() - degenerate.float())
    return torch.floor(out).clamp_(0, LEVELS - 1).to(x.dtype)


def color(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """ImageEnhance.Color: blend with the image's grey version."""
    return blend(grayscale(x).expand_as(x), x, factor)


def contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """ImageEnhance.Contrast: blend with a flat image at the grey mean (rounded to a level)."""
    grey = grayscale(x).to(torch.float64)
    mean = torch.floor(grey.mean(dim=(1, 2, 3)) + 0.5)  # int(ImageStat mean + 0.5)
    return blend(_per_image(mean, x).expand_as(x), x, factor)


def brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """ImageEnhance.Brightness: blend with black."""
    return blend(torch.zeros_like(x), x, factor)


def smooth(x: torch.Tensor) -> torch.Tensor:
    """ImageFilter.SMOOTH (3 x 3 kernel 1-1-1 / 1-5-1 / 1-1-1 over 13, rounded); Pillow leaves the
    border pixels as they are. Summed in float32 in Pillow's order (row below, row, row above)."""
    if x.shape[-1] < 3 or x.shape[-2] < 3:
        return x
    k1, k5 = torch.tensor(1 / 13, dtype=torch.float32), torch.tensor(5 / 13, dtype=torch.float32)
    xf = x.float()

    def row(r: torch.Tensor, centre: torch.Tensor) -> torch.Tensor:
        return (r[..., :-2] * k1 + r[..., 1:-1] * centre) + r[..., 2:] * k1

    s = torch.full_like(xf[..., 1:-1, 1:-1], 0.5)  # Pillow's offset + 0.5: rounding
    s = s + row(xf[..., 2:, :], k1)
    s = s + row(xf[..., 1:-1, :], k5)
    s = s + row(xf[..., :-2, :], k1)
    out = x.clone()
    out[..., 1:-1, 1:-1] = torch.floor(s).clamp_(0, LEVELS - 1).to(x.dtype)
    return out


def sharpness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """ImageEnhance.Sharpness: blend with the smoothed image."""
    return blend(smooth(x), x, factor)


# ---- geometry -------------------------------------------------------------------------------------


def _cubic(v0, v1, v2, v3, d):
    """Pillow's geometric bicubic (Keys, a = -1) between v1 and v2 at fraction d, in its Horner form."""
    p2 = v2 - v0
    p3 = 2 * (v0 - v1) + v2 - v3
    p4 = -v0 + v1 - v2 + v3
    return v1 + d * (p2 + d * (p3 + d * p4))


def affine(
    x: torch.Tensor, matrix: torch.Tensor, fill: Sequence[float], interpolation: str = "bicubic"
) -> torch.Tensor:
    """Image.transform(size, AFFINE, matrix, resample, fillcolor=fill) for every image.

    x: [B, C, H, W] levels; matrix: [B, 2, 3] (Pillow's ``(a, b, c, d, e, f)``: the output pixel
    centre ``(x + 0.5, y + 0.5)`` samples the input at ``(a x + b y + c, d x + e y + f)``);
    fill: one level per channel for sources outside the image. Returns [B, C, H, W] levels.
    """
    if interpolation not in ("bicubic", "bilinear"):
        raise ValueError(
            f"interpolation {interpolation!r}: RandAugment's geometric operations take bicubic or bilinear"
        )
    B, C, H, W = x.shape
    dev = x.device
    # float64 as in Pillow: in float32 a sample landing on a whole level truncates one level lower
    m = matrix.to(device=dev, dtype=torch.float64).view(B, 2, 3, 1, 1)
    ys = (torch.arange(H, device=dev, dtype=torch.float64) + 0.5).view(1, H, 1)
    xs = (torch.arange(W, device=dev, dtype=torch.float64) + 0.5).view(1, 1, W)
    u = m[:, 0, 0] * xs + m[:, 0, 1] * ys + m[:, 0, 2]  # [B, H, W] source x (continuous)
    v = m[:, 1, 0] * xs + m[:, 1, 1] * ys + m[:, 1, 2]
    inside = (u >= 0) & (u < W) & (v >= 0) & (v < H)
    u, v = u - 0.5, v - 0.5  # pixel-centre coordinates
    x0, y0 = torch.floor(u), torch.floor(v)
    dx, dy = (u - x0).view(B, 1, H, W), (v - y0).view(B, 1, H, W)
    # each row of the k x k neighbourhood (edge pixels repeated) gathered at once, interpolated
    # along x, then the k row values along y: float64 temporaries of k x the image, not k x k
    offsets = torch.arange(-1, 3, device=dev) if interpolation == "bicubic" else torch.arange(0, 2, device=dev)
    k = offsets.numel()
    cols = (x0.long().unsqueeze(1) + offsets.view(1, k, 1, 1)).clamp_(0, W - 1)  # [B, k, H, W]
    rows = (y0.long().unsqueeze(1) + offsets.view(1, k, 1, 1)).clamp_(0, H - 1)
    flat = x.reshape(B, C, H * W).double()
    across = []
    for r in range(k):
        idx = (rows[:, r : r + 1] * W + cols).view(B, 1, k * H * W).expand(B, C, -1)
        taps = flat.gather(2, idx).view(B, C, k, H, W)
        if interpolation == "bilinear":  # Pillow's BILINEAR: along x, then y
            across.append(taps[:, :, 0] + (taps[:, :, 1] - taps[:, :, 0]) * dx)
        else:  # Pillow's BICUBIC: each row along x, then the four rows along y
            across.append(_cubic(taps[:, :, 0], taps[:, :, 1], taps[:, :, 2], taps[:, :, 3], dx))
    if interpolation == "bilinear":
        out = across[0] + (across[1] - across[0]) * dy
    else:
        out = _cubic(*across, dy)
    out = torch.floor(out).clamp_(0, LEVELS - 1)  # Pillow truncates
    fill_t = torch.as_tensor(list(fill), dtype=out.dtype, device=dev).view(1, -1, 1, 1).expand(B, C, H, W)
    return torch.where(inside.unsqueeze(1), out, fill_t).to(x.dtype)


def rotate_matrix(degrees: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Image.rotate(degrees) (counter-clockwise about the centre) as affine matrices: [B] -> [B, 2, 3]."""
    out = []
    cx, cy = width / 2.0, height / 2.0
    for deg in degrees.tolist():
        a = -math.radians(deg)
        c, s = round(math.cos(a), 15), round(math.sin(a), 15)  # Pillow rounds the same way
        out.append([[c, s, c * -cx + s * -cy + cx], [-s, c, -s * -cx + c * -cy + cy]])
    return torch.tensor(out, dtype=torch.float64).view(-1, 2, 3)


def shear_matrix(factor: torch.Tensor, axis: str) -> torch.Tensor:
    """timm's shear_x ``(1, f, 0, 0, 1, 0)`` / shear_y ``(1, 0, 0, f, 1, 0)``: [B] -> [B, 2, 3]."""
    m = torch.zeros(factor.shape[0], 2, 3, dtype=torch.float64)
    m[:, 0, 0] = m[:, 1, 1] = 1
    if axis == "x":
        m[:, 0, 1] = factor.double()
    else:
        m[:, 1, 0] = factor.double()
    return m


def translate_matrix(pixels: torch.Tensor, axis: str) -> torch.Tensor:
    """timm's translate ``(1, 0, p, 0, 1, 0)`` / ``(1, 0, 0, 0, 1, p)``: the content moves by -p."""
    m = torch.zeros(pixels.shape[0], 2, 3, dtype=torch.float64)
    m[:, 0, 0] = m[:, 1, 1] = 1
    m[:, 0 if axis == "x" else 1, 2] = pixels.double()
    return m
