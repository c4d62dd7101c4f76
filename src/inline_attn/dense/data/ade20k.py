"""ADE20K scene parsing, as the ADEChallengeData2016 folder holds it: the 150 class names, the
folder dataset (:class:`ADE20K`) with mmseg's training and evaluation pipeline, and the pair of
sets a segmentation config asks for (:func:`build_ade20k_sets`).

Items are float32 images ``[3, H, W]`` in 0-255 units (RGB, not normalised) and int64 labels
``[H, W]`` (``ignore_index`` = 255 where unlabelled or padded). Training items are addressed as
``(index, seed)`` (:class:`~inline_attn.dense.data.loading.StepSampler`) and draw every augmentation from
``seed``.

A file that cannot be used (truncated, zero-byte or garbage image or label, labels of another
size or out of range) is handled as the classification reader handles one
(:mod:`inline_attn.data.unreadable`): a training item logs it once, counts it and takes the next
readable sample instead; an evaluation item stops with a ValueError naming the file, since a
skipped or substituted image would change the score.
"""

from __future__ import annotations

import os
import pathlib
from typing import TYPE_CHECKING, Optional, Sequence, Union

import numpy as np
import torch

from ...data.unreadable import UnreadableFiles, decode_image
from ...data.subset import subset_size
from .transforms import (
    pad_to,
    photometric_distortion,
    random_crop,
    random_flip,
    random_resize,
    rescale_size,
    resize_pair,
)

if TYPE_CHECKING:
    from ..config import SegConfig

__all__ = ["ADE20K", "ADE20K_CLASSES", "ADE_LAYOUT", "build_ade20k_sets"]

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
    subset: the first N pairs (``data.val_subset``; 0: all; more than the split holds is a
    ValueError naming both numbers). Training items are addressed ``ds[(index, seed)]`` (augmented by mmseg's pipeline);
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
        self.pairs = pairs[: subset_size(subset, len(pairs), str(img_dir))]
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


def build_ade20k_sets(cfg: SegConfig, *, train: bool = True):
    """(train set or None, val set) of ADE20K for a segmentation config's ``data`` (``data.path``:
    the folder; the pipeline's settings)."""
    d = cfg.data
    if not d.path:
        raise ValueError(f"data.path is required for ADE20K: the folder with the layout {ADE_LAYOUT}")
    kw = dict(
        crop_size=d.crop_size,
        scale=d.scale,
        ratio_range=d.ratio_range,
        cat_max_ratio=d.cat_max_ratio,
        flip=d.flip,
        photometric=d.photometric,
        mean=d.mean,
    )
    tr = (
        ADE20K(d.path, "train", reduce_zero_label=d.reduce_zero_label, pipeline=_SegPipeline(train=True, **kw))
        if train
        else None
    )
    va = ADE20K(
        d.path,
        "val",
        reduce_zero_label=d.reduce_zero_label,
        pipeline=_SegPipeline(train=False, **kw),
        subset=int(d.val_subset),
    )
    return tr, va
