"""A dense config's datasets and their batches: :func:`build_seg_datasets` (ADE20K or the
Fashion-MNIST mosaics), :func:`build_det_datasets` (the mosaics or a COCO-layout folder), the
step-indexed :class:`StepSampler` that makes training resumable, and the collate functions.

Training samples are addressed as ``(index, seed)``: the sampler decides both from the step
number alone, and the dataset draws every augmentation from ``seed``, so step t's batch is the
same after a resume and under any number of loader workers.

The datasets live beside their sources: :mod:`.ade20k`, :mod:`.mosaic_sets` and :mod:`.coco`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np
import torch

from .ade20k import build_ade20k_sets
from .mosaic_sets import MosaicDet, MosaicSeg, build_mosaic_sets

if TYPE_CHECKING:
    from ..config import DetConfig, SegConfig

__all__ = [
    "StepSampler",
    "build_det_datasets",
    "build_seg_datasets",
    "collate",
    "det_collate",
]


class StepSampler:
    """The (index, seed) pairs of each step's per-process batch, from the step number alone.

    Global sample p = step * batch * world + rank * batch + j walks through one random
    permutation of the dataset per pass (epoch = p // n), as mmseg's infinite sampler does.
    """

    def __init__(self, n: int, batch_size: int, *, seed: int = 0, rank: int = 0, world_size: int = 1):
        if n < 1 or batch_size < 1:
            raise ValueError(f"dataset of {n} samples, batch_size {batch_size}: both must be >= 1")
        self.n, self.bs, self.seed, self.rank, self.world = n, batch_size, seed, rank, world_size
        self._perm: tuple[int, Optional[np.ndarray]] = (-1, None)

    def _order(self, epoch: int) -> np.ndarray:
        if self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng((self.seed, epoch)).permutation(self.n))
        return self._perm[1]

    def batch(self, step: int) -> list[tuple[int, int]]:
        out = []
        for j in range(self.bs):
            p = (step * self.world + self.rank) * self.bs + j
            idx = int(self._order(p // self.n)[p % self.n])
            out.append((idx, int(np.random.default_rng((self.seed, 7919, p)).integers(2**62))))
        return out

    def steps(self, start: int, stop: int):
        for s in range(start, stop):
            yield self.batch(s)


def collate(items: list) -> tuple[torch.Tensor, torch.Tensor]:
    """[(image [3, H, W], label [H, W]), ...] of one size -> ([B, 3, H, W], [B, H, W])."""
    return torch.stack([i[0] for i in items]), torch.stack([i[1] for i in items])


def build_seg_datasets(cfg: SegConfig, *, train: bool = True, progress: bool = False):
    """(train set or None, val set) for ``cfg.data``; both have ``classes`` and ``num_classes``."""
    d = cfg.data
    if d.dataset == "mosaic":
        return build_mosaic_sets(cfg, train, progress, MosaicSeg)
    if d.dataset != "ade20k":
        raise ValueError(f"data.dataset={d.dataset!r}: expected 'ade20k' or 'mosaic'")
    return build_ade20k_sets(cfg, train=train)


def det_collate(items: list) -> tuple[torch.Tensor, list[dict], list[tuple[int, int]]]:
    """[(image [3, h_i, w_i], target)] -> (images [B, 3, H, W] zero-padded right and bottom to the
    largest, targets, sizes (h_i, w_i))."""
    sizes = [tuple(img.shape[-2:]) for img, _ in items]
    h, w = max(s[0] for s in sizes), max(s[1] for s in sizes)
    batch = torch.zeros(len(items), items[0][0].shape[0], h, w)
    for k, (img, _) in enumerate(items):
        batch[k, :, : img.shape[1], : img.shape[2]] = img
    return batch, [t for _, t in items], sizes


def build_det_datasets(cfg: DetConfig, *, train: bool = True, progress: bool = False):
    """(train set or None, val set) for a detection config's ``data``: the mosaics or a COCO-layout
    folder (``data.coco.{train,val}_{ann,images}``; the val set is its first ``data.val_subset``
    images). An annotation file whose (chosen) images hold no object is a ValueError naming it."""
    from .coco import EVAL_KEYS, CocoDetection, check_has_objects, check_instances

    d = cfg.data
    if d.dataset == "mosaic":
        return build_mosaic_sets(cfg, train, progress, MosaicDet)
    if d.dataset != "coco":
        raise ValueError(f"data.dataset={d.dataset!r}: expected 'mosaic' or 'coco'")
    c = d.coco
    need = (["train_ann", "train_images"] if train else []) + ["val_ann", "val_images"]
    if any(not getattr(c, k) for k in need):
        raise ValueError(f"data.dataset=coco needs data.coco.{{{', '.join(need)}}} (instances JSON and image folder)")
    kw = dict(short_size=int(c.short_size), max_size=int(c.max_size))
    tr = CocoDetection(c.train_ann, c.train_images, flip=float(d.flip), **kw) if train else None
    va = CocoDetection(c.val_ann, c.val_images, subset=int(d.val_subset), **kw)
    check_instances(va.coco, c.val_ann, EVAL_KEYS)  # what COCOeval reads, before any training
    check_has_objects(va, c.val_ann, training=False)
    if tr is not None:
        check_has_objects(tr, c.train_ann, training=True)
        check_same_categories(tr, va, c.train_ann, c.val_ann)
    return tr, va


def check_same_categories(train_set, val_set, train_name, val_name) -> None:
    """ValueError unless both sets have the same categories (ids and names): the model's label k
    is category ``train_set.cat_ids[k]``, so any difference would score label k as another class."""
    a = dict(zip(train_set.cat_ids, train_set.classes))
    b = dict(zip(val_set.cat_ids, val_set.classes))
    if a == b:
        return
    only_train, only_val = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    renamed = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    raise ValueError(
        f"the validation annotations {val_name} have {len(b)} categories, the training ones {train_name} {len(a)}: "
        f"ids only in training {only_train[:10]}, only in validation {only_val[:10]}, named differently "
        f"{renamed[:10]}; both must list the same categories (COCO's instances_*.json all list the 80)"
    )
