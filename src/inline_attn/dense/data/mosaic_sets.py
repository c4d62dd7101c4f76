"""The Fashion-MNIST mosaics (:mod:`.mosaic`) as datasets, each mosaic drawn once and held in
memory: :class:`MosaicSeg` for segmentation (semantic labels, 11 classes) and :class:`MosaicDet`
for detection (boxes, 10 classes), and the pair of sets a config asks for
(:func:`build_mosaic_sets`).

Training items ``ds[(index, seed)]`` are flipped left-right with probability ``flip``, drawn from
``seed`` (:class:`~inline_attn.dense.data.loading.StepSampler`); evaluation items ``ds[index]`` are
returned as generated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

import numpy as np
import torch

from ...runtime.progress import progress_bar
from .mosaic import MOSAIC_CLASSES, FashionMosaics, MosaicSpec
from ...data.subset import subset_size

if TYPE_CHECKING:
    from ..config import DetConfig, SegConfig

__all__ = ["MosaicDet", "MosaicSeg", "build_mosaic_sets"]


def _render_all(mosaics: FashionMosaics, progress: bool) -> list[dict]:
    """Every mosaic of ``mosaics`` drawn once (they are small: the sets keep them in memory)."""
    desc = f"mosaics ({mosaics.split})"
    return [mosaics[i] for i in progress_bar(range(len(mosaics)), desc=desc, progress=progress, leave=False)]


class MosaicSeg(torch.utils.data.Dataset):
    """Fashion-MNIST mosaics as a segmentation set (11 classes, nothing ignored), held in memory.

    Training items ``ds[(index, seed)]`` are flipped left-right with probability ``flip``;
    evaluation items ``ds[index]`` are returned as generated.
    """

    classes = MOSAIC_CLASSES
    num_classes = len(MOSAIC_CLASSES)

    def __init__(self, mosaics: FashionMosaics, *, flip: float = 0.5, progress: bool = False):
        self.mosaics = mosaics
        items = _render_all(mosaics, progress)
        self.images = torch.stack([it["image"] for it in items])
        self.labels = torch.stack([it["label"] for it in items])
        self.flip = flip

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, item):
        index, seed = item if isinstance(item, tuple) else (item, None)
        img, lab = self.images[index].float(), self.labels[index].long()
        if seed is not None and self.flip > 0 and np.random.default_rng(seed).random() < self.flip:
            img, lab = img.flip(-1), lab.flip(-1)
        return img, lab


class MosaicDet(torch.utils.data.Dataset):
    """Fashion-MNIST mosaics as a detection set, held in memory: 10 classes (label = mosaic class
    - 1, COCO category id = mosaic class, as :func:`~inline_attn.dense.data.coco.mosaics_to_coco`).

    ``ds[i]`` / ``ds[(i, seed)]`` (flipped left-right with probability ``flip``): (image float
    [3, S, S] 0-255, ``{"boxes" [N, 4] xyxy, "labels" [N]}``).
    """

    classes = MOSAIC_CLASSES[1:]
    num_classes = len(MOSAIC_CLASSES) - 1
    cat_ids = list(range(1, len(MOSAIC_CLASSES)))

    def __init__(self, mosaics: FashionMosaics, *, flip: float = 0.5, progress: bool = False):
        self.mosaics = mosaics
        items = _render_all(mosaics, progress)
        self.images = torch.stack([it["image"] for it in items])
        self.boxes = [it["boxes"] for it in items]
        self.labels = [it["classes"] - 1 for it in items]
        self.flip = flip
        self._gt = None

    def __len__(self) -> int:
        return self.images.shape[0]

    def image_id(self, index: int) -> int:
        return index + 1

    def scale(self, index: int) -> float:
        return 1.0

    def coco_gt(self) -> dict:
        from .coco import mosaics_to_coco

        if self._gt is None:
            self._gt = mosaics_to_coco(self.mosaics)
        return self._gt

    def __getitem__(self, item):
        from .transforms import flip_boxes

        index, seed = item if isinstance(item, tuple) else (item, None)
        img, boxes = self.images[index].float(), self.boxes[index]
        if seed is not None and self.flip > 0 and np.random.default_rng(seed).random() < self.flip:
            img, boxes = img.flip(-1), flip_boxes(boxes, img.shape[-1])
        return img, {"boxes": boxes, "labels": self.labels[index]}


def build_mosaic_sets(cfg: Union[SegConfig, DetConfig], train: bool, progress: bool, wrap):
    """(train set or None, val set) of mosaics for a config's ``data.mosaic``, each wrapped as
    ``wrap`` (:class:`MosaicSeg` or :class:`MosaicDet`); the val set is the first
    ``data.val_subset`` of the ``data.mosaic.val`` mosaics (more is a ValueError)."""
    d = cfg.data
    m = d.mosaic
    spec = MosaicSpec(
        size=int(m.size),
        objects=tuple(m.objects),
        scale=tuple(m.scale),
        noise=float(m.noise),
        max_overlap=float(m.max_overlap),
    )
    kw = dict(spec=spec, seed=int(m.seed), root=d.path, pool=int(m.pool))
    tr = wrap(FashionMosaics("train", int(m.train), **kw), flip=float(d.flip), progress=progress) if train else None
    n_val = subset_size(d.val_subset, int(m.val), f"the validation set (data.mosaic.val={int(m.val)})")
    return tr, wrap(FashionMosaics("val", n_val, **kw), flip=0.0, progress=progress)
