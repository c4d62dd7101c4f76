"""ImageNet-layout folders: ``root/<class>/<image>``, decoded with Pillow.

Every sample comes out as a uint8 tensor ``[3, S, S]`` of one fixed size so that batches can be
stacked and augmented on the training device (:mod:`inline_attn.data.transforms`):

- training: the shorter side is resized to ``S = round(img_size / crop_pct)`` and the centre
  square kept; the random resized crop to ``img_size`` happens later, batched, on the device
  (a crop of this square rather than of the whole photo: the price of batched augmentation);
- evaluation: the shorter side is resized to ``floor(img_size / crop_pct)`` and the centre
  ``img_size`` square is cropped (timm's eval transform).

An image that fails to decode is logged once. Training substitutes the next readable sample, so
a corrupt file never stops an epoch; evaluation returns ``(None, label)`` for it, so the caller
skips it and counts it (a substitute would be scored twice).
"""
from __future__ import annotations

import logging
import math
import os
import pathlib
from typing import Optional, Union

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

log = logging.getLogger(__name__)

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")
_RESAMPLE = {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR, "nearest": Image.NEAREST}


def resize_center_crop(img: Image.Image, resize: int, crop: int, interpolation: str = "bicubic") -> Image.Image:
    """Resize the shorter side to ``resize`` (aspect kept), then crop the centre ``crop`` square."""
    if interpolation not in _RESAMPLE:
        raise ValueError(f"unknown interpolation {interpolation!r}: expected one of {sorted(_RESAMPLE)}")
    w, h = img.size
    scale = resize / min(w, h)
    nw, nh = max(crop, round(w * scale)), max(crop, round(h * scale))
    img = img.resize((nw, nh), _RESAMPLE[interpolation])
    left, top = (nw - crop) // 2, (nh - crop) // 2
    return img.crop((left, top, left + crop, top + crop))


class ImageFolder(Dataset):
    """Class-per-subfolder image dataset (classes sorted by name -> index).

    Args:
        root: folder holding one subfolder per class.
        img_size: network input size.
        train: training layout (centre square of side img_size / crop_pct) or eval layout.
        crop_pct: eval centre-crop fraction (timm convention).
        interpolation: Pillow resampling for the resize.
        skip_unreadable: return ``(None, label)`` for an unreadable image instead of the next
            readable one (default: True for evaluation, False for training).
    """

    def __init__(self, root: Union[str, os.PathLike], img_size: int, *, train: bool,
                 crop_pct: float = 0.875, interpolation: str = "bicubic", skip_unreadable: Optional[bool] = None):
        self.root = pathlib.Path(root)
        if not self.root.is_dir():
            raise ValueError(f"data folder {self.root} does not exist (expected an ImageNet-layout "
                             "folder: one subfolder of images per class)")
        if not 0 < crop_pct <= 1:
            raise ValueError(f"crop_pct={crop_pct} must be in (0, 1]")
        self.classes = sorted(d.name for d in self.root.iterdir() if d.is_dir() and not d.name.startswith("."))
        if not self.classes:
            raise ValueError(f"data folder {self.root} has no class subfolders")
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples: list[tuple[str, int]] = []
        for c in self.classes:
            files = sorted(p for p in (self.root / c).rglob("*")
                           if p.is_file() and p.suffix.lower() in IMG_EXTENSIONS)
            if not files:
                raise ValueError(f"class folder {self.root / c} holds no images (extensions {IMG_EXTENSIONS})")
            self.samples += [(str(p), self.class_to_idx[c]) for p in files]
        self.img_size = int(img_size)
        self.train = train
        self.crop_pct = crop_pct
        self.interpolation = interpolation
        if train:
            self.resize = self.crop = round(self.img_size / crop_pct)
        else:
            self.resize, self.crop = math.floor(self.img_size / crop_pct), self.img_size
        self.skip_unreadable = (not train) if skip_unreadable is None else bool(skip_unreadable)
        self.bad: set[int] = set()

    @property
    def labels(self) -> torch.Tensor:
        return torch.tensor([t for _, t in self.samples])

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, i: int) -> torch.Tensor:
        """Decode sample ``i`` to uint8 ``[3, S, S]`` (raises on a corrupt file)."""
        with Image.open(self.samples[i][0]) as img:
            img = resize_center_crop(img.convert("RGB"), self.resize, self.crop, self.interpolation)
            arr = np.asarray(img, dtype=np.uint8)
        return torch.from_numpy(arr.copy()).permute(2, 0, 1)

    def _unreadable(self, j: int, e: Exception) -> None:
        if j not in self.bad:
            self.bad.add(j)
            log.warning("unreadable image %s (%s: %s)", self.samples[j][0], type(e).__name__, e)

    def __getitem__(self, i: int):
        if self.skip_unreadable:
            try:
                return self.load(i), self.samples[i][1]
            except Exception as e:  # corrupt/truncated/unreadable: the caller skips and counts it
                self._unreadable(i, e)
                return None, self.samples[i][1]
        for k in range(len(self.samples)):
            j = (i + k) % len(self.samples)
            if j in self.bad:
                continue
            try:
                return self.load(j), self.samples[j][1]
            except Exception as e:  # corrupt/truncated/unreadable: substitute, never stop the epoch
                self._unreadable(j, e)
        raise ValueError(f"no readable image in {self.root}")
