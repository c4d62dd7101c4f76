"""ImageNet-layout folders: ``root/<class>/<image>``, decoded with Pillow.

Every sample comes out as a uint8 tensor ``[3, S, S]`` of one fixed size so that batches can be
stacked and augmented on the training device (:mod:`inline_attn.data.transforms`):

- training with ``rrc``: timm's random resized crop of the whole decoded image, resized to
  ``img_size`` with Pillow (:func:`~inline_attn.data.crop.random_resized_crop_pil`); the box is
  drawn from a generator seeded by (seed, epoch, sample), so a sample's crop does not depend on
  the loader's workers or on where a resumed run restarts (:meth:`ImageFolder.set_epoch`);
- training without ``rrc``: the shorter side is resized to ``S = round(img_size / crop_pct)`` and
  the centre square kept (the device crops or resizes later);
- evaluation: :func:`~inline_attn.data.crop.eval_resize_pil` (``eval_resize`` "shorter" or
  "squash") and the centre ``img_size`` square.

An image that fails to decode is logged once (:mod:`.unreadable`). Training substitutes the next
readable sample, so a corrupt file never stops an epoch; evaluation returns ``(None, label)`` for
it, so the caller skips it and counts it (a substitute would be scored twice).
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from .crop import EVAL_RESIZE, RESAMPLE, eval_resize_pil, random_resized_crop_pil
from .unreadable import UnreadableFiles


IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")


@dataclass(frozen=True)
class RRC:
    """Random resized crop settings: area fraction and aspect ratio ranges."""

    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)


class ImageFolder(Dataset):
    """Class-per-subfolder image dataset (classes sorted by name -> index).

    Args:
        root: folder holding one subfolder per class.
        img_size: network input size.
        train: training layout (see the module doc) or eval layout.
        crop_pct: eval centre-crop fraction (timm convention).
        interpolation: Pillow resampling for the resizes.
        eval_resize: "shorter" or "squash" (eval layout).
        rrc: training with a random resized crop of the whole image (its settings), or None.
        seed: with ``rrc``, seeds the per-sample crop generators.
        skip_unreadable: return ``(None, label)`` for an unreadable image instead of the next
            readable one (default: True for evaluation, False for training).
    """

    def __init__(
        self,
        root: Union[str, os.PathLike],
        img_size: int,
        *,
        train: bool,
        crop_pct: float = 0.875,
        interpolation: str = "bicubic",
        eval_resize: str = "shorter",
        rrc: Optional[RRC] = None,
        seed: int = 0,
        skip_unreadable: Optional[bool] = None,
    ):
        self.root = pathlib.Path(root)
        if not self.root.is_dir():
            raise ValueError(
                f"data folder {self.root} does not exist (expected an ImageNet-layout "
                "folder: one subfolder of images per class)"
            )
        if not 0 < crop_pct <= 1:
            raise ValueError(f"crop_pct={crop_pct} must be in (0, 1]")
        if interpolation not in RESAMPLE:
            raise ValueError(f"unknown interpolation {interpolation!r}: expected one of {sorted(RESAMPLE)}")
        if eval_resize not in EVAL_RESIZE:
            raise ValueError(f"eval_resize={eval_resize!r}: expected one of {EVAL_RESIZE}")
        self.classes = sorted(d.name for d in self.root.iterdir() if d.is_dir() and not d.name.startswith("."))
        if not self.classes:
            raise ValueError(f"data folder {self.root} has no class subfolders")
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples: list[tuple[str, int]] = []
        for c in self.classes:
            files = sorted(p for p in (self.root / c).rglob("*") if p.is_file() and p.suffix.lower() in IMG_EXTENSIONS)
            if not files:
                raise ValueError(f"class folder {self.root / c} holds no images (extensions {IMG_EXTENSIONS})")
            self.samples += [(str(p), self.class_to_idx[c]) for p in files]
        self.img_size = int(img_size)
        self.train = train
        self.crop_pct = crop_pct
        self.interpolation = interpolation
        self.eval_resize = eval_resize
        self.rrc = rrc if train else None
        self.seed = int(seed)
        self.epoch = 0
        self.skip_unreadable = (not train) if skip_unreadable is None else bool(skip_unreadable)
        self.unreadable = UnreadableFiles(len(self.samples), self.describe, f"data folder {self.root}")

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next samples belong to (their random crops depend on it)."""
        self.epoch = int(epoch)

    @property
    def out_size(self) -> int:
        """The side of the samples this dataset returns."""
        if self.train and self.rrc is None:
            return round(self.img_size / self.crop_pct)
        return self.img_size

    @property
    def labels(self) -> torch.Tensor:
        return torch.tensor([t for _, t in self.samples])

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.samples)

    def describe(self, i: int) -> str:
        return f"image {self.samples[i][0]}"

    def load(self, i: int) -> torch.Tensor:
        """Decode sample ``i`` to uint8 ``[3, S, S]`` (raises on a corrupt file)."""
        with Image.open(self.samples[i][0]) as img:
            img = img.convert("RGB")
            if self.rrc is not None:
                rng = np.random.default_rng((self.seed, self.epoch, i))
                img = random_resized_crop_pil(
                    img, self.img_size, rng, self.rrc.scale, self.rrc.ratio, self.interpolation
                )
            elif self.train:
                img = eval_resize_pil(img, self.out_size, 1.0, "shorter", self.interpolation)
            else:
                img = eval_resize_pil(img, self.img_size, self.crop_pct, self.eval_resize, self.interpolation)
            arr = np.asarray(img, dtype=np.uint8)
        return torch.from_numpy(arr.copy()).permute(2, 0, 1)

    def __getitem__(self, i: int):
        if self.skip_unreadable:
            try:
                return self.load(i), self.samples[i][1]
            except Exception as e:  # corrupt/truncated/unreadable: the caller skips and counts it
                self.unreadable.note(i, e)
                return None, self.samples[i][1]
        return self.unreadable.substitute(i, lambda j: (self.load(j), self.samples[j][1]))
