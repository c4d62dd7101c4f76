"""Segmentation and detection configs: typed sections on :mod:`inline_attn.runtime.config`.

:class:`SegConfig` and :class:`DetConfig` hold one dataclass per section (``model``, ``data``,
``optim``, ``sched``, ``eval``, ``train``); ``data.mosaic`` and ``data.coco`` are nested sections.
A config is the defaults below, a YAML file on top (``_base_`` chains), then ``--section.key
VALUE`` overrides; every value is checked before any work starts (unknown keys with
did-you-mean, types, ranges: a ValueError naming the key, the value and what was expected).
``model.backbone_kwargs`` is free-form (arguments of :class:`~inline_attn.dense.DenseBackbone` /
:func:`inline_attn.create_model`).

The model sections split in two: the backbone's settings (:data:`BACKBONE_SETTINGS`) and
everything else, which goes by name to :func:`~inline_attn.dense.build_segmentor` or
:func:`~inline_attn.dense.build_detector` (:meth:`DenseModelCfg.head_kwargs`): a new head setting
is one field here.

The segmentation defaults are the paper's ADE20K Semantic FPN recipe (PVT's: 512 x 512 crops, 16
images per step over 8 GPUs, AdamW lr 2e-4, weight decay 1e-4, poly decay of power 0.9 over 40k
iterations); detection's is FCOS (Tian et al. 2019) on the same backbone, optimiser and schedule.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from ..runtime.config import (
    OptimCfg,
    RunCfg,
    TypedConfig,
    check_mean_std,
    setting,
)

__all__ = [
    "BACKBONE_SETTINGS",
    "DetConfig",
    "SegConfig",
]

PathLike = Union[str, os.PathLike]
ADE_MEAN = (123.675, 116.28, 103.53)  # ImageNet mean / std in 0-255 units (RGB), as mmseg
ADE_STD = (58.395, 57.12, 57.375)


def _positive_pair(key: str, value) -> None:
    if value is not None and min(value) < 1:
        raise ValueError(f"{key}={list(value)}: expected two integers >= 1")


# --- model


@dataclass
class DenseModelCfg:
    """The backbone's settings, shared by segmentation and detection."""

    backbone: str = setting("inline_pvt_tiny", doc="registered backbone model name")
    backbone_kwargs: dict = setting(factory=dict, doc="free-form: pattern, embed_dims, depths, out_norms, ...")
    pretrained: Optional[str] = setting(None, doc="classification checkpoint (ours or the authors') for the backbone")
    checkpoint: Optional[str] = setting(None, doc="whole-model weights to start from")
    drop_path: Optional[float] = setting(None, ge=0, lt=1, doc="backbone stochastic depth (null: the variant's)")
    frozen_stages: int = setting(-1, ge=-1, doc="stages kept frozen (-1: none)")
    norm_eval: bool = setting(False, doc="backbone norms in eval mode")
    num_classes: Optional[int] = setting(None, ge=1, doc="null: the dataset's")

    def backbone_kwargs_for_build(self) -> dict:
        """:class:`~inline_attn.dense.DenseBackbone`'s arguments: ``backbone_kwargs`` and the
        backbone settings (a checkpoint named in a config is trusted, as classification's)."""
        kw = dict(self.backbone_kwargs)
        kw.update(
            frozen_stages=self.frozen_stages, norm_eval=self.norm_eval, pretrained=self.pretrained, weights_only=False
        )
        if self.drop_path is not None:
            kw["drop_path_rate"] = self.drop_path
        return kw

    def head_kwargs(self) -> dict:
        """Every setting that is not the backbone's, by name (the builder's keyword arguments)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in BACKBONE_SETTINGS}


BACKBONE_SETTINGS = frozenset(f.name for f in dataclasses.fields(DenseModelCfg))


@dataclass
class SegModelCfg(DenseModelCfg):
    decode: Literal["semantic_fpn", "upernet"] = setting("semantic_fpn", doc="decode head")
    channels: Optional[int] = setting(None, ge=1, doc="decode head width (null: 128 semantic_fpn, 512 upernet)")
    neck_channels: int = setting(256, ge=1, doc="FPN neck width")
    aux_weight: Optional[float] = setting(
        None, ge=0, doc="auxiliary FCN head loss weight (null: 0 semantic_fpn, 0.4 upernet)"
    )
    aux_channels: int = setting(256, ge=1, doc="auxiliary head width")
    dropout: float = setting(0.1, ge=0, lt=1, doc="dropout before the classifier")
    ignore_index: int = setting(255, ge=0, doc="label value ignored by the loss and the metrics")
    avg_non_ignore: bool = setting(False, doc="average the loss over non-ignored pixels only")


@dataclass
class DetModelCfg(DenseModelCfg):
    neck_channels: int = setting(256, ge=1, doc="FPN neck width")
    head_channels: Optional[int] = setting(None, ge=1, doc="FCOS tower width (null: neck_channels)")
    num_convs: int = setting(4, ge=0, doc="convolutions per FCOS tower")
    range_scale: float = setting(
        8.0, gt=0, doc="level l takes objects whose largest point-to-side distance is in [r s_{l-1}, r s_l)"
    )
    center_radius: float = setting(1.5, gt=0, doc="centre sampling radius (in strides)")
    focal_alpha: float = setting(0.25, ge=0, le=1, doc="focal loss alpha")
    focal_gamma: float = setting(2.0, ge=0, doc="focal loss gamma")
    score_threshold: float = setting(0.05, ge=0, le=1, doc="detections below this score are dropped")
    pre_nms: int = setting(1000, ge=1, doc="top candidates per level before NMS")
    nms_iou: float = setting(0.6, gt=0, le=1, doc="NMS IoU threshold")
    max_per_image: int = setting(100, ge=1, doc="detections kept per image")


# --- data


@dataclass
class MosaicCfg:
    """Fashion-MNIST mosaics (:class:`~inline_attn.dense.MosaicSpec`)."""

    size: int = setting(64, ge=8, doc="canvas side in pixels")
    train: int = setting(4000, ge=1, doc="training mosaics")
    val: int = setting(300, ge=1, doc="validation mosaics")
    seed: int = setting(0, ge=0, doc="mosaic seed")
    pool: int = setting(0, ge=0, doc="garments drawn from the first N of a split (0: all)")
    objects: tuple[int, int] = setting((2, 3), doc="garments per mosaic, [min, max]")
    scale: tuple[float, float] = setting((1.0, 1.0), doc="garment scale range")
    noise: float = setting(0.05, ge=0, doc="canvas noise")
    max_overlap: float = setting(0.15, ge=0, le=1, doc="largest overlap between garments")

    def check(self) -> None:
        lo, hi = self.objects
        if not 1 <= lo <= hi:
            raise ValueError(f"data.mosaic.objects={list(self.objects)}: expected 1 <= min <= max")
        lo, hi = self.scale
        if not 0 < lo <= hi:
            raise ValueError(f"data.mosaic.scale={list(self.scale)}: expected 0 < low <= high")


@dataclass
class CocoCfg:
    """A COCO-layout folder: instances JSON and image folder per split."""

    train_ann: Optional[str] = setting(None, doc="instances_train2017.json", resume=True)
    train_images: Optional[str] = setting(None, doc="its image folder", resume=True)
    val_ann: Optional[str] = setting(None, doc="instances_val2017.json", resume=True)
    val_images: Optional[str] = setting(None, doc="its image folder", resume=True)
    short_size: int = setting(800, ge=1, doc="images resized to this short side (mmdet's 1x scale)")
    max_size: int = setting(1333, ge=1, doc="... and a long side at most this")

    def check(self) -> None:
        if self.max_size < self.short_size:
            raise ValueError(
                f"data.coco.max_size={self.max_size} is below data.coco.short_size={self.short_size}: "
                "expected max_size >= short_size"
            )


@dataclass
class DenseDataCfg:
    path: Optional[str] = setting(
        None, doc="dataset root, or the Fashion-MNIST folder for mosaics (null: Debian's)", resume=True
    )
    flip: float = setting(0.5, ge=0, le=1, doc="horizontal flip probability")
    mean: tuple[float, ...] = setting(ADE_MEAN, doc="per-channel mean, 0-255 units")
    std: tuple[float, ...] = setting(ADE_STD, doc="per-channel std, 0-255 units")
    batch_size: int = setting(2, ge=1, doc="images per process and iteration")
    workers: int = setting(2, ge=0, doc="data loader processes", resume=True)
    val_subset: int = setting(
        0,
        ge=0,
        doc="evaluate on the first N validation images (0: all; N above the set's size is refused)",
        resume=True,
    )
    mosaic: MosaicCfg = setting(factory=MosaicCfg, doc="Fashion-MNIST mosaics")

    def check(self) -> None:
        check_mean_std("data", self.mean, self.std)


@dataclass
class SegDataCfg(DenseDataCfg):
    dataset: Literal["ade20k", "mosaic"] = setting(
        "ade20k", doc="ade20k (ADEChallengeData2016 layout) | mosaic (Fashion-MNIST mosaics)"
    )
    reduce_zero_label: bool = setting(True, doc="ADE20K: label 0 (other) ignored, classes shift down by one")
    crop_size: tuple[int, int] = setting((512, 512), doc="training crop (h, w)")
    scale: Optional[tuple[int, int]] = setting((2048, 512), doc="RandomResize / test Resize (long, short) edge")
    ratio_range: Optional[tuple[float, float]] = setting((0.5, 2.0), doc="random resize ratio range (null: none)")
    cat_max_ratio: float = setting(0.75, gt=0, le=1, doc="largest share of one class in a random crop")
    photometric: bool = setting(True, doc="photometric distortion")

    def check(self) -> None:
        super().check()
        _positive_pair("data.crop_size", self.crop_size)
        _positive_pair("data.scale", self.scale)
        if self.ratio_range is not None and not 0 < self.ratio_range[0] <= self.ratio_range[1]:
            raise ValueError(f"data.ratio_range={list(self.ratio_range)}: expected 0 < low <= high")


@dataclass
class DetDataCfg(DenseDataCfg):
    dataset: Literal["mosaic", "coco"] = setting("mosaic", doc="mosaic | coco (data.coco.*)")
    workers: int = setting(0, ge=0, doc="data loader processes", resume=True)
    coco: CocoCfg = setting(factory=CocoCfg, doc="a COCO-layout folder")


# --- optimisation and run


@dataclass
class DenseOptimCfg(OptimCfg, defaults={"lr": 2.0e-4, "weight_decay": 1.0e-4}):
    """The shared optimizer settings; ``lr`` is not scaled with the batch, and needs a value."""

    def check(self) -> None:
        super().check()
        if self.lr is None:
            raise ValueError("optim.lr=null: segmentation and detection train at a set learning rate (e.g. 0.0002)")


@dataclass
class PolySchedCfg:
    iters: int = setting(40000, ge=1, doc="training iterations")
    warmup_iters: int = setting(0, ge=0, at_most="sched.iters", doc="linear warm-up iterations")
    warmup_ratio: float = setting(1.0e-6, gt=0, le=1, doc="warm-up starts at lr * warmup_ratio")
    power: float = setting(0.9, ge=0, doc="poly decay power (0: constant lr)")
    min_lr: float = setting(0.0, ge=0, at_most="optim.lr", doc="lr at the end (at most optim.lr)")


@dataclass
class DetEvalCfg:
    interval: int = setting(
        4000, ge=0, doc="evaluate every N iterations (and at the end); 0: only at the end", resume=True
    )
    batch_size: int = setting(8, ge=1, doc="validation images per forward", resume=True)


@dataclass
class SegEvalCfg(DetEvalCfg):
    mode: Literal["whole", "slide"] = setting("whole", doc="whole-image or sliding-window inference", resume=True)
    crop_size: tuple[int, int] = setting((512, 512), doc="slide window (h, w)", resume=True)
    stride: tuple[int, int] = setting((341, 341), doc="slide stride (h, w)", resume=True)
    flip: bool = setting(False, doc="average with the flipped image's prediction", resume=True)
    batch_size: int = setting(1, ge=1, doc="validation images per forward", resume=True)

    def check(self) -> None:
        _positive_pair("eval.crop_size", self.crop_size)
        _positive_pair("eval.stride", self.stride)
        if self.mode == "slide" and any(s > c for s, c in zip(self.stride, self.crop_size)):
            raise ValueError(
                f"eval.stride={list(self.stride)} exceeds eval.crop_size={list(self.crop_size)}: "
                "sliding windows would leave pixels unpredicted (expected stride <= crop)"
            )


@dataclass
class DenseTrainCfg(RunCfg, defaults={"output": "runs/seg", "tensorboard": False}):
    checkpoint_interval: int = setting(4000, ge=1, doc="checkpoint every N iterations (and at the end)", resume=True)
    log_interval: int = setting(50, ge=1, doc="a metrics row every N iterations", resume=True)
    predictions_png: bool = setting(True, doc="a PNG of validation predictions beside the ground truth", resume=True)


@dataclass
class DetTrainCfg(DenseTrainCfg, defaults={"output": "runs/det"}):
    pass


@dataclass
class SegConfig(TypedConfig):
    """A whole segmentation config; ``SegConfig()`` holds the defaults."""

    model: SegModelCfg = field(default_factory=SegModelCfg)
    data: SegDataCfg = field(default_factory=SegDataCfg)
    optim: DenseOptimCfg = field(default_factory=DenseOptimCfg)
    sched: PolySchedCfg = field(default_factory=PolySchedCfg)
    eval: SegEvalCfg = field(default_factory=SegEvalCfg)
    train: DenseTrainCfg = field(default_factory=DenseTrainCfg)


@dataclass
class DetConfig(TypedConfig):
    """A whole detection config; ``DetConfig()`` holds the defaults."""

    model: DetModelCfg = field(default_factory=DetModelCfg)
    data: DetDataCfg = field(default_factory=DetDataCfg)
    optim: DenseOptimCfg = field(default_factory=DenseOptimCfg)
    sched: PolySchedCfg = field(default_factory=PolySchedCfg)
    eval: DetEvalCfg = field(default_factory=DetEvalCfg)
    train: DetTrainCfg = field(default_factory=DetTrainCfg)
