"""mmseg's segmentation training pipeline on numpy / Pillow / kornia, one sample at a time.

Images are float32 ``[H, W, 3]`` in 0-255 units (RGB), labels uint8 ``[H, W]``; every random
choice comes from the ``numpy.random.Generator`` passed in, so a sample is a function of its
seed (resumable, and the same under any number of loader workers).

Pipeline (mmseg's ADE20K config): :func:`random_resize` (target (2048, 512) times a ratio in
[0.5, 2], aspect kept), :func:`random_crop` (512 x 512, at most 75 % of one class,
``cat_max_ratio``), :func:`random_flip` (p = 0.5), :func:`photometric_distortion`, then
:func:`pad_to` (image with the mean colour, i.e. 0 after normalisation; labels with 255).
Detection's left-right flip moves the boxes with the image (:func:`flip_boxes`).
Resizing uses Pillow (bilinear for images, nearest for labels); mmcv uses OpenCV, whose
bilinear does not low-pass filter when shrinking, so downscaled pixels differ slightly.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from PIL import Image

__all__ = [
    "flip_boxes",
    "pad_to",
    "photometric_distortion",
    "random_crop",
    "random_flip",
    "random_resize",
    "rescale_size",
    "resize_pair",
]


def rescale_size(h: int, w: int, scale: Sequence[int]) -> tuple[int, int]:
    """mmcv's keep-ratio rescale: the largest (h', w') with long edge <= max(scale) and short
    edge <= min(scale), rounded. Returns (h', w')."""
    long_edge, short_edge = max(scale), min(scale)
    factor = min(long_edge / max(h, w), short_edge / min(h, w))
    return max(1, int(h * factor + 0.5)), max(1, int(w * factor + 0.5))


def resize_pair(img: np.ndarray, label: np.ndarray | None, size: tuple[int, int]):
    """Resize an image (bilinear) and its label map (nearest) to ``size`` = (h, w)."""
    h, w = size
    if img.shape[:2] != (h, w):
        img = np.stack(
            [np.asarray(Image.fromarray(img[..., c]).resize((w, h), Image.BILINEAR)) for c in range(img.shape[2])],
            axis=-1,
        )
    if label is not None and label.shape != (h, w):
        label = np.asarray(Image.fromarray(label).resize((w, h), Image.NEAREST))
    return img, label


def random_resize(
    img: np.ndarray, label: np.ndarray, rng: np.random.Generator, scale: Sequence[int], ratio_range: Sequence[float]
):
    """Resize so the image fits ``scale`` x r, r uniform in ``ratio_range``, keeping the aspect ratio."""
    r = rng.uniform(*ratio_range)
    target = (int(scale[0] * r), int(scale[1] * r))
    return resize_pair(img, label, rescale_size(img.shape[0], img.shape[1], target))


def random_crop(
    img: np.ndarray,
    label: np.ndarray,
    rng: np.random.Generator,
    crop: Sequence[int],
    cat_max_ratio: float = 1.0,
    ignore_index: int = 255,
    tries: int = 10,
):
    """A random ``crop`` = (h, w) window (the whole side where the image is smaller). With
    ``cat_max_ratio`` < 1, up to ``tries`` windows are drawn until one holds at least two classes
    and no class covers more than that fraction of its labelled pixels (mmseg's rule)."""
    ch, cw = min(crop[0], img.shape[0]), min(crop[1], img.shape[1])

    def draw():
        y = int(rng.integers(0, img.shape[0] - ch + 1))
        x = int(rng.integers(0, img.shape[1] - cw + 1))
        return y, x

    y, x = draw()
    if cat_max_ratio < 1.0:
        for _ in range(tries):
            vals, counts = np.unique(label[y : y + ch, x : x + cw], return_counts=True)
            counts = counts[vals != ignore_index]
            if len(counts) > 1 and counts.max() / counts.sum() < cat_max_ratio:
                break
            y, x = draw()
    return img[y : y + ch, x : x + cw], label[y : y + ch, x : x + cw]


def random_flip(img: np.ndarray, label: np.ndarray, rng: np.random.Generator, p: float = 0.5):
    """Left-right flip with probability ``p``."""
    if p > 0 and rng.random() < p:
        return img[:, ::-1], label[:, ::-1]
    return img, label


def photometric_distortion(
    img: np.ndarray,
    rng: np.random.Generator,
    brightness: float = 32,
    contrast=(0.5, 1.5),
    saturation=(0.5, 1.5),
    hue: int = 18,
) -> np.ndarray:
    """mmseg's PhotoMetricDistortion on a float RGB image in 0-255 units, each step with p = 0.5:
    brightness + U(-32, 32); contrast x U(0.5, 1.5) (before or after the colour steps, chosen at
    random); saturation x U(0.5, 1.5) and hue + randint(-18, 18) OpenCV units (2 degrees each) in
    HSV. Values are clipped to [0, 255] after each step (mmseg also truncates to uint8; we keep
    floats)."""
    from kornia.color import hsv_to_rgb, rgb_to_hsv

    img = img.astype(np.float32)
    if rng.integers(2):
        img = np.clip(img + rng.uniform(-brightness, brightness), 0, 255)
    contrast_first = bool(rng.integers(2))
    if contrast_first and rng.integers(2):
        img = np.clip(img * rng.uniform(*contrast), 0, 255)
    do_sat = bool(rng.integers(2))
    sat = rng.uniform(*saturation) if do_sat else None
    do_hue = bool(rng.integers(2))
    shift = int(rng.integers(-hue, hue + 1)) if do_hue else None
    if do_sat or do_hue:
        hsv = rgb_to_hsv(torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1) / 255.0)
        if do_sat:
            hsv[1] = (hsv[1] * sat).clamp(0, 1)
        if do_hue:
            hsv[0] = torch.remainder(hsv[0] + shift * np.pi / 90.0, 2 * np.pi)
        img = (hsv_to_rgb(hsv).permute(1, 2, 0).numpy() * 255.0).clip(0, 255).astype(np.float32)
    if not contrast_first and rng.integers(2):
        img = np.clip(img * rng.uniform(*contrast), 0, 255)
    return img


def pad_to(img: np.ndarray, label: np.ndarray, size: Sequence[int], fill: Sequence[float], ignore_index: int = 255):
    """Pad (bottom / right) to at least ``size`` = (h, w): the image with ``fill`` (per channel),
    the labels with ``ignore_index``."""
    h, w = img.shape[:2]
    ph, pw = max(size[0] - h, 0), max(size[1] - w, 0)
    if not ph and not pw:
        return img, label
    out = np.empty((h + ph, w + pw, img.shape[2]), np.float32)
    out[:] = np.asarray(fill, np.float32)
    out[:h, :w] = img
    lab = np.full((h + ph, w + pw), ignore_index, label.dtype)
    lab[:h, :w] = label
    return out, lab


def flip_boxes(boxes: torch.Tensor, width: int) -> torch.Tensor:
    """Boxes [N, 4] of an image flipped left-right (``width`` pixels)."""
    return torch.stack([width - boxes[:, 2], boxes[:, 1], width - boxes[:, 0], boxes[:, 3]], -1)
