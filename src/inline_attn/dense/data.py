"""Segmentation datasets for training and evaluation: ADE20K (the ADEChallengeData2016 layout)
and the Fashion-MNIST mosaics, plus a step-indexed sampler that makes training resumable.

Training samples are addressed as ``(index, seed)``: the sampler decides both from the step
number alone, and the dataset draws every augmentation from ``seed``, so step t's batch is the
same after a resume and under any number of loader workers.

Every dataset returns float32 images ``[3, H, W]`` in 0-255 units (RGB, not normalised) and
int64 labels ``[H, W]`` (``ignore_index`` = 255 where unlabelled or padded).

A file that cannot be used (truncated, zero-byte or garbage image or label, labels of another
size or out of range) is handled as the classification reader handles one
(:mod:`inline_attn.data.unreadable`): a training item logs it once, counts it and takes the next
readable sample instead; an evaluation item stops with a ValueError naming the file, since a
skipped or substituted image would change the score.
"""

from __future__ import annotations

import os
import pathlib
from typing import Optional, Sequence, Union

import numpy as np
import torch
from ..data.unreadable import UnreadableFiles, decode_image
from .mosaic import MOSAIC_CLASSES, FashionMosaics, MosaicSpec
from .transforms import (
    pad_to,
    photometric_distortion,
    random_crop,
    random_flip,
    random_resize,
    rescale_size,
    resize_pair,
)

__all__ = [
    "ADE20K",
    "ADE20K_CLASSES",
    "MosaicDet",
    "MosaicSeg",
    "StepSampler",
    "build_det_datasets",
    "build_seg_datasets",
    "collate",
    "det_collate",
]

PathLike = Union[str, os.PathLike]

ADE20K_CLASSES = (
    "wall",
    "building",
    "sky",
    "floor",
    "tree",
    "ceiling",
    "road",
    "bed",
    "windowpane",
    "grass",
    "cabinet",
    "sidewalk",
    "person",
    "earth",
    "door",
    "table",
    "mountain",
    "plant",
    "curtain",
    "chair",
    "car",
    "water",
    "painting",
    "sofa",
    "shelf",
    "house",
    "sea",
    "mirror",
    "rug",
    "field",
    "armchair",
    "seat",
    "fence",
    "desk",
    "rock",
    "wardrobe",
    "lamp",
    "bathtub",
    "railing",
    "cushion",
    "base",
    "box",
    "column",
    "signboard",
    "chest of drawers",
    "counter",
    "sand",
    "sink",
    "skyscraper",
    "fireplace",
    "refrigerator",
    "grandstand",
    "path",
    "stairs",
    "runway",
    "case",
    "pool table",
    "pillow",
    "screen door",
    "stairway",
    "river",
    "bridge",
    "bookcase",
    "blind",
    "coffee table",
    "toilet",
    "flower",
    "book",
    "hill",
    "bench",
    "countertop",
    "stove",
    "palm",
    "kitchen island",
    "computer",
    "swivel chair",
    "boat",
    "bar",
    "arcade machine",
    "hovel",
    "bus",
    "towel",
    "light",
    "truck",
    "tower",
    "chandelier",
    "awning",
    "streetlight",
    "booth",
    "television receiver",
    "airplane",
    "dirt track",
    "apparel",
    "pole",
    "land",
    "bannister",
    "escalator",
    "ottoman",
    "bottle",
    "buffet",
    "poster",
    "stage",
    "van",
    "ship",
    "fountain",
    "conveyer belt",
    "canopy",
    "washer",
    "plaything",
    "swimming pool",
    "stool",
    "barrel",
    "basket",
    "waterfall",
    "tent",
    "bag",
    "minibike",
    "cradle",
    "oven",
    "ball",
    "food",
    "step",
    "tank",
    "trade name",
    "microwave",
    "pot",
    "animal",
    "bicycle",
    "lake",
    "dishwasher",
    "screen",
    "blanket",
    "sculpture",
    "hood",
    "sconce",
    "vase",
    "traffic light",
    "tray",
    "ashcan",
    "fan",
    "pier",
    "crt screen",
    "plate",
    "monitor",
    "bulletin board",
    "shower",
    "radiator",
    "glass",
    "clock",
    "flag",
)
_ADE_SPLITS = {"train": "training", "training": "training", "val": "validation", "validation": "validation"}
_IMG_EXT = (".jpg", ".jpeg", ".png")
ADE_LAYOUT = (
    "ADEChallengeData2016/{images,annotations}/{training,validation}/ (images *.jpg, labels *.png with the same stem)"
)


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


class _SegPipeline:
    """Shared training/eval transforms (see :mod:`.transforms`)."""

    def __init__(
        self,
        *,
        train: bool,
        crop_size=(512, 512),
        scale=(2048, 512),
        ratio_range=(0.5, 2.0),
        cat_max_ratio: float = 0.75,
        flip: float = 0.5,
        photometric: bool = True,
        mean: Sequence[float] = (123.675, 116.28, 103.53),
        ignore_index: int = 255,
    ):
        self.train, self.crop_size, self.scale, self.ratio_range = train, tuple(crop_size), tuple(scale), ratio_range
        self.cat_max_ratio, self.flip, self.photometric = cat_max_ratio, flip, photometric
        self.mean, self.ignore_index = tuple(mean), ignore_index

    def __call__(self, img: np.ndarray, label: np.ndarray, seed: Optional[int]):
        if not self.train:
            size = rescale_size(img.shape[0], img.shape[1], self.scale) if self.scale else img.shape[:2]
            img, _ = resize_pair(img, None, size)
            return _to_tensors(img, label)
        rng = np.random.default_rng(seed)
        img = img.astype(np.float32) if img.dtype != np.float32 else img
        if self.ratio_range:
            img, label = random_resize(img, label, rng, self.scale, self.ratio_range)
        img, label = random_crop(img, label, rng, self.crop_size, self.cat_max_ratio, self.ignore_index)
        img, label = random_flip(img, label, rng, self.flip)
        if self.photometric:
            img = photometric_distortion(img, rng)
        img, label = pad_to(img, label, self.crop_size, self.mean, self.ignore_index)
        return _to_tensors(img, label)


def _to_tensors(img: np.ndarray, label: np.ndarray):
    return (
        torch.from_numpy(np.ascontiguousarray(img, dtype=np.float32)).permute(2, 0, 1).contiguous(),
        torch.from_numpy(np.ascontiguousarray(label).astype(np.int64)),
    )


class ADE20K(torch.utils.data.Dataset):
    """ADE20K scene parsing (ADEChallengeData2016): 150 classes, labels reduced by one
    (``reduce_zero_label``: raw 0 "other" -> 255, ignored).

    root: the ``ADEChallengeData2016`` folder or its parent. split: "train" / "val".
    Training items are addressed ``ds[(index, seed)]`` (augmented by mmseg's pipeline);
    evaluation items ``ds[index]`` give the image resized to the test scale and the labels at
    the original size. :meth:`read` returns the raw pair.
    """

    classes = ADE20K_CLASSES
    num_classes = 150

    def __init__(
        self,
        root: PathLike,
        split: str = "train",
        *,
        reduce_zero_label: bool = True,
        pipeline: Optional[_SegPipeline] = None,
        subset: int = 0,
    ):
        if split not in _ADE_SPLITS:
            raise ValueError(f"ADE20K split {split!r}: expected 'train' or 'val'")
        root = pathlib.Path(root)
        if (root / "ADEChallengeData2016").is_dir():
            root = root / "ADEChallengeData2016"
        sub = _ADE_SPLITS[split]
        img_dir, ann_dir = root / "images" / sub, root / "annotations" / sub
        for d in (img_dir, ann_dir):
            if not d.is_dir():
                raise ValueError(
                    f"ADE20K folder {root} has no {d.relative_to(root)}/ (split {split!r}); "
                    f"expected the layout {ADE_LAYOUT}"
                )
        images = sorted(p for p in img_dir.iterdir() if p.suffix.lower() in _IMG_EXT)
        if not images:
            raise ValueError(f"{img_dir} holds no images (*.jpg / *.png); expected the layout {ADE_LAYOUT}")
        pairs = []
        for p in images:
            ann = ann_dir / (p.stem + ".png")
            if not ann.is_file():
                raise ValueError(f"image {p} has no label file {ann}")
            pairs.append((p, ann))
        self.pairs = pairs[:subset] if subset else pairs
        self.root, self.split, self.reduce_zero_label = root, split, reduce_zero_label
        self.pipeline = pipeline or _SegPipeline(train=split.startswith("train"))
        self.unreadable = UnreadableFiles(len(self.pairs), self.describe, str(img_dir))

    def __len__(self) -> int:
        return len(self.pairs)

    def describe(self, index: int) -> str:
        return f"ADE20K pair {self.pairs[index][0].name} / {self.pairs[index][1].name}"

    def read(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(RGB uint8 [H, W, 3], labels uint8 [H, W] after ``reduce_zero_label``), checked: a
        ValueError naming the file when it cannot be decoded or does not fit its pair."""
        img_path, ann_path = self.pairs[index]
        img = np.asarray(decode_image(img_path, "image").convert("RGB"))
        im = decode_image(ann_path, "label file")
        if im.mode not in ("L", "P"):
            raise ValueError(f"label file {ann_path} has mode {im.mode}: expected a single-channel PNG (L or P)")
        label = np.array(im)
        if img.shape[:2] != label.shape:
            raise ValueError(
                f"image {img_path} is {img.shape[1]}x{img.shape[0]} but its labels {ann_path} are "
                f"{label.shape[1]}x{label.shape[0]}"
            )
        top = self.num_classes if self.reduce_zero_label else self.num_classes - 1
        bad = (label > top) & (label != 255)
        if bad.any():
            raise ValueError(
                f"label file {ann_path} holds values {sorted(np.unique(label[bad]).tolist())[:10]} "
                f"outside the classes (0..{top}, 255 = ignore)"
            )
        if self.reduce_zero_label:
            label = label.astype(np.int16) - 1
            label[label < 0] = 255
            label[label == 254] = 255
            label = label.astype(np.uint8)
        return img, label

    def __getitem__(self, item):
        index, seed = item if isinstance(item, tuple) else (item, None)
        if seed is None:  # evaluation: stop, naming the file
            img, label = self.read(index)
        else:  # training: an unreadable pair is logged, counted and replaced by the next readable one
            img, label = self.unreadable.substitute(index, self.read)
        return self.pipeline(img, label, seed)


def _render_all(mosaics: FashionMosaics, progress: bool) -> list[dict]:
    """Every mosaic of ``mosaics`` drawn once (they are small: the sets keep them in memory)."""
    from tqdm import tqdm

    desc = f"mosaics ({mosaics.split})"
    return [mosaics[i] for i in tqdm(range(len(mosaics)), desc=desc, disable=not progress, leave=False)]


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


def build_seg_datasets(cfg: dict, *, train: bool = True, progress: bool = False):
    """(train set or None, val set) for ``cfg["data"]``; both have ``classes`` and ``num_classes``."""
    d = cfg["data"]
    if d["dataset"] == "mosaic":
        return _mosaic_sets(cfg, train, progress, MosaicSeg)
    if d["dataset"] != "ade20k":
        raise ValueError(f"data.dataset={d['dataset']!r}: expected 'ade20k' or 'mosaic'")
    if not d["path"]:
        raise ValueError(f"data.path is required for ADE20K: the folder with the layout {ADE_LAYOUT}")
    kw = dict(
        crop_size=d["crop_size"],
        scale=d["scale"],
        ratio_range=d["ratio_range"],
        cat_max_ratio=d["cat_max_ratio"],
        flip=d["flip"],
        photometric=d["photometric"],
        mean=d["mean"],
    )
    tr = (
        ADE20K(d["path"], "train", reduce_zero_label=d["reduce_zero_label"], pipeline=_SegPipeline(train=True, **kw))
        if train
        else None
    )
    va = ADE20K(
        d["path"],
        "val",
        reduce_zero_label=d["reduce_zero_label"],
        pipeline=_SegPipeline(train=False, **kw),
        subset=int(d["val_subset"]),
    )
    return tr, va


class MosaicDet(torch.utils.data.Dataset):
    """Fashion-MNIST mosaics as a detection set, held in memory: 10 classes (label = mosaic class
    - 1, COCO category id = mosaic class, as :func:`~inline_attn.dense.coco.mosaics_to_coco`).

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
        from .boxes import flip_boxes

        index, seed = item if isinstance(item, tuple) else (item, None)
        img, boxes = self.images[index].float(), self.boxes[index]
        if seed is not None and self.flip > 0 and np.random.default_rng(seed).random() < self.flip:
            img, boxes = img.flip(-1), flip_boxes(boxes, img.shape[-1])
        return img, {"boxes": boxes, "labels": self.labels[index]}


def det_collate(items: list) -> tuple[torch.Tensor, list[dict], list[tuple[int, int]]]:
    """[(image [3, h_i, w_i], target)] -> (images [B, 3, H, W] zero-padded right and bottom to the
    largest, targets, sizes (h_i, w_i))."""
    sizes = [tuple(img.shape[-2:]) for img, _ in items]
    h, w = max(s[0] for s in sizes), max(s[1] for s in sizes)
    batch = torch.zeros(len(items), items[0][0].shape[0], h, w)
    for k, (img, _) in enumerate(items):
        batch[k, :, : img.shape[1], : img.shape[2]] = img
    return batch, [t for _, t in items], sizes


def _mosaic_sets(cfg: dict, train: bool, progress: bool, wrap):
    d = cfg["data"]
    m = d["mosaic"]
    spec = MosaicSpec(
        size=int(m["size"]),
        objects=tuple(m["objects"]),
        scale=tuple(m["scale"]),
        noise=float(m["noise"]),
        max_overlap=float(m["max_overlap"]),
    )
    kw = dict(spec=spec, seed=int(m["seed"]), root=d["path"], pool=int(m["pool"]))
    tr = (
        wrap(FashionMosaics("train", int(m["train"]), **kw), flip=float(d["flip"]), progress=progress)
        if train
        else None
    )
    n_val = int(d["val_subset"] or m["val"])
    return tr, wrap(FashionMosaics("val", n_val, **kw), flip=0.0, progress=progress)


def build_det_datasets(cfg: dict, *, train: bool = True, progress: bool = False):
    """(train set or None, val set) for a detection config's ``data``: the mosaics or a COCO-layout
    folder (``data.coco.{train,val}_{ann,images}``)."""
    from .coco import EVAL_KEYS, CocoDetection, check_instances

    d = cfg["data"]
    if d["dataset"] == "mosaic":
        return _mosaic_sets(cfg, train, progress, MosaicDet)
    if d["dataset"] != "coco":
        raise ValueError(f"data.dataset={d['dataset']!r}: expected 'mosaic' or 'coco'")
    c = d["coco"]
    need = (["train_ann", "train_images"] if train else []) + ["val_ann", "val_images"]
    if any(not c[k] for k in need):
        raise ValueError(f"data.dataset=coco needs data.coco.{{{', '.join(need)}}} (instances JSON and image folder)")
    kw = dict(short_size=int(c["short_size"]), max_size=int(c["max_size"]))
    tr = CocoDetection(c["train_ann"], c["train_images"], flip=float(d["flip"]), **kw) if train else None
    va = CocoDetection(c["val_ann"], c["val_images"], **kw)
    check_instances(va.coco, c["val_ann"], EVAL_KEYS)  # what COCOeval reads, before any training
    if tr is not None:
        check_same_categories(tr, va, c["train_ann"], c["val_ann"])
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
