"""Fashion-MNIST mosaics: real garments on a noisy canvas, with semantic labels and instances.

Each mosaic is a function of (seed, split, index) only, so any subset can be rebuilt anywhere
(a torchrun rank, a test, the detection code) without storing it:

1. a canvas of one random colour (each channel uniform in ``background``) ;
2. 2-3 garments (``objects``), each a real Fashion-MNIST image scaled (bilinear) to a side of
   28 x uniform(``scale``) pixels, placed uniformly inside the canvas (re-drawn up to 10 times
   while its square covers more than ``max_overlap`` of itself with earlier garments' squares;
   the last draw is kept), tinted by a random colour
   (each channel uniform in ``tint``) and alpha-blended with its own intensity as alpha; later
   garments cover earlier ones;
3. Gaussian pixel noise (std ``noise``) over everything.

Labels: a pixel belongs to a garment where its scaled intensity exceeds ``threshold`` (of 255);
the semantic map holds the visible garment's class + 1 (0 = background; 11 classes), and each
garment whose visible part covers at least ``min_area`` pixels is an instance, with its
visible mask and that mask's box ``[x1, y1, x2, y2)`` (x2, y2 exclusive). Smaller remnants keep
their semantic label but are not instances.

Training mosaics draw garments from the Fashion-MNIST training split only, validation mosaics
from the test split only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ...data.fmnist import FMNIST_CLASSES, load_fashion_mnist

__all__ = ["MOSAIC_CLASSES", "FashionMosaics", "MosaicSpec", "make_mosaic"]

MOSAIC_CLASSES = ("background",) + FMNIST_CLASSES
_SPLITS = {"train": ("train", 0), "val": ("test", 1)}


@dataclass(frozen=True)
class MosaicSpec:
    """How mosaics look. Sizes in pixels; colours and noise in [0, 1] units."""

    size: int = 64
    objects: tuple[int, int] = (2, 3)
    scale: tuple[float, float] = (1.0, 1.0)
    threshold: int = 50
    background: tuple[float, float] = (0.0, 0.4)
    tint: tuple[float, float] = (0.45, 1.0)
    noise: float = 0.05
    min_area: int = 16
    max_overlap: float = 0.15

    def __post_init__(self):
        lo, hi = self.objects
        if not 1 <= lo <= hi:
            raise ValueError(f"objects={self.objects} must satisfy 1 <= min <= max")
        if not 0 < self.scale[0] <= self.scale[1]:
            raise ValueError(f"scale={self.scale} must satisfy 0 < min <= max")
        if int(round(28 * self.scale[1])) > self.size:
            raise ValueError(
                f"a garment of scale {self.scale[1]} ({round(28 * self.scale[1])} px) does not fit "
                f"a {self.size} px mosaic"
            )
        if not 0 <= self.threshold < 255:
            raise ValueError(f"threshold={self.threshold} must be in [0, 255)")
        if not 0 <= self.max_overlap <= 1:  # NaN too
            raise ValueError(f"max_overlap={self.max_overlap} must be a fraction in [0, 1]")

    def to_dict(self) -> dict:
        return asdict(self)


def make_mosaic(garments: np.ndarray, classes: np.ndarray, rng: np.random.Generator, spec: MosaicSpec) -> dict:
    """One mosaic from a pool of garments.

    garments: uint8 [N, 28, 28]; classes: int [N] (0..9); rng: the mosaic's own generator.
    Returns ``image`` uint8 [3, S, S], ``label`` uint8 [S, S] (0 = background, c + 1 = class c),
    ``boxes`` float32 [n, 4] xyxy, ``classes`` int64 [n] (1..10, as in ``label``), ``masks``
    bool [n, S, S] (visible parts), ``sources`` int64 [m] (indices of every placed garment).
    """
    s = spec.size
    canvas = np.empty((3, s, s), np.float32)
    canvas[:] = rng.uniform(*spec.background, size=(3, 1, 1))
    label = np.zeros((s, s), np.uint8)
    owner = np.full((s, s), -1, np.int64)
    n = int(rng.integers(spec.objects[0], spec.objects[1] + 1))
    picks = rng.integers(0, len(garments), size=n)
    placed = np.zeros((s, s), bool)
    for k, idx in enumerate(picks):
        side = int(round(28 * rng.uniform(*spec.scale)))
        g = torch.from_numpy(garments[idx].astype(np.float32))[None, None]
        g = F.interpolate(g, size=(side, side), mode="bilinear", align_corners=False)[0, 0].numpy()
        for _ in range(10 if spec.max_overlap < 1.0 else 1):
            y, x = (int(v) for v in rng.integers(0, s - side + 1, size=2))
            if placed[y : y + side, x : x + side].mean() <= spec.max_overlap:
                break
        placed[y : y + side, x : x + side] = True
        tint = rng.uniform(*spec.tint, size=(3, 1, 1)).astype(np.float32)
        alpha = np.clip(g / 255.0, 0.0, 1.0)[None]
        region = canvas[:, y : y + side, x : x + side]
        canvas[:, y : y + side, x : x + side] = region * (1 - alpha) + tint * alpha
        mask = g > spec.threshold
        label[y : y + side, x : x + side][mask] = classes[idx] + 1
        owner[y : y + side, x : x + side][mask] = k
    canvas += rng.normal(0.0, spec.noise, size=canvas.shape).astype(np.float32)
    image = np.clip(np.rint(canvas * 255), 0, 255).astype(np.uint8)
    boxes, cls, masks = [], [], []
    for k, idx in enumerate(picks):
        vis = owner == k
        if vis.sum() < spec.min_area:
            continue
        ys, xs = np.nonzero(vis)
        boxes.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
        cls.append(int(classes[idx]) + 1)
        masks.append(vis)
    return {
        "image": torch.from_numpy(image),
        "label": torch.from_numpy(label),
        "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
        "classes": torch.tensor(cls, dtype=torch.int64),
        "masks": torch.from_numpy(np.stack(masks)) if masks else torch.zeros((0, s, s), dtype=torch.bool),
        "sources": torch.from_numpy(picks.astype(np.int64)),
    }


class FashionMosaics(torch.utils.data.Dataset):
    """``num`` deterministic mosaics of ``split`` ("train": garments from the Fashion-MNIST
    training split; "val": from its test split).

    ``ds[i]`` is the dict of :func:`make_mosaic`; :meth:`tensors` stacks images [N, 3, S, S]
    uint8 and labels [N, S, S] uint8 for fast training. ``root``: the Fashion-MNIST folder (None:
    ``$INLINE_ATTN_FMNIST`` or Debian's path); ``pool``: use only the first ``pool`` garments of
    the split (0: all).
    """

    classes = MOSAIC_CLASSES
    num_classes = len(MOSAIC_CLASSES)

    def __init__(
        self,
        split: str = "train",
        num: int = 1000,
        spec: Optional[MosaicSpec] = None,
        seed: int = 0,
        root=None,
        pool: int = 0,
        garments: Optional[tuple[np.ndarray, np.ndarray]] = None,
    ):
        if split not in _SPLITS:
            raise ValueError(f"mosaic split {split!r}: expected 'train' or 'val'")
        if num < 1:
            raise ValueError(f"num={num} mosaics: must be >= 1")
        if seed < 0:  # numpy's generators take non-negative seeds only
            raise ValueError(f"seed={seed}: must be >= 0")
        self.split, self.num, self.seed = split, int(num), int(seed)
        self.spec = spec or MosaicSpec()
        if garments is None:
            src = load_fashion_mnist(root, _SPLITS[split][0])
            images, labels = src.images[:, 0].numpy(), src.labels.numpy()
        else:
            images, labels = garments
        if pool:
            images, labels = images[:pool], labels[:pool]
        self.garments, self.garment_classes = np.ascontiguousarray(images), np.asarray(labels)

    def __len__(self) -> int:
        return self.num

    def rng(self, index: int) -> np.random.Generator:
        return np.random.default_rng((self.seed, _SPLITS[self.split][1], int(index)))

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.num:
            raise IndexError(f"mosaic {index} out of range (0..{self.num - 1})")
        return make_mosaic(self.garments, self.garment_classes, self.rng(index), self.spec)

    def tensors(self, indices: Optional[Sequence[int]] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(images uint8 [n, 3, S, S], labels uint8 [n, S, S]) for ``indices`` (default all)."""
        idx = range(self.num) if indices is None else indices
        items = [self[i] for i in idx]
        return torch.stack([it["image"] for it in items]), torch.stack([it["label"] for it in items])
