"""Classification configs: the typed sections of a training run on :mod:`inline_attn.runtime.config`.

:class:`Config` holds one dataclass per section (``model``, ``data``, ``aug``, ``optim``,
``sched``, ``train``); each field's default, allowed range and help text are declared once, on
the field, and the ``--section.key`` command-line flags are generated from them. A config is
read as a dict (a YAML file, following ``_base_: other.yaml`` first, then ``section.key``
overrides) and converted by :meth:`Config.from_dict`, which checks every value before any work
starts: an unknown key, a wrong type or a value out of range is a ValueError naming the key.
``model.kwargs`` is free-form (constructor arguments for :func:`inline_attn.create_model`).

To add a setting, add a field to its section (with :func:`setting`); YAML, the command line, the
saved ``config.yaml`` and the resume check pick it up.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from ..runtime.config import (
    OptimCfg,
    RunCfg,
    TypedConfig,
    check_mean_std,
    fields_of,
    setting,
)

__all__ = [
    "AugCfg",
    "Config",
    "DataCfg",
    "ModelCfg",
    "ClassifyOptimCfg",
    "SchedCfg",
    "TrainCfg",
    "configs_dir",
]

PathLike = Union[str, os.PathLike]

# the learning rate scales with the total batch: lr = base_lr * total_batch / LR_REFERENCE_BATCH
LR_REFERENCE_BATCH = 512
DEMO_CONFIG = "fmnist/demo.yaml"
# the Fashion-MNIST comparison's attention variants, one config each: configs/fmnist/<variant>.yaml
FMNIST_VARIANTS = ("softmax", "linear", "inline_nolr", "inline")


@dataclass
class ModelCfg:
    name: str = setting("inline_deit_tiny", doc="registered model name (inline-attn list)")
    kwargs: dict = setting(factory=dict, doc="constructor overrides as a mapping, e.g. '{depth: 4}'")
    drop_path: float = setting(0.1, ge=0, lt=1, doc="stochastic depth rate")
    drop: float = setting(0.0, ge=0, lt=1, doc="dropout rate")
    checkpoint: Optional[str] = setting(
        None,
        doc="initial weights for fine-tuning, ours or the authors' (relative position tables and position "
        "embeddings of another size resized bicubically; a head of another shape starts at zero)",
    )
    checkpoint_ema: bool = setting(
        False, doc="initialise from the checkpoint's EMA weights (model_ema / state_dict_ema)"
    )
    grad_checkpointing: bool = setting(
        False, doc="recompute each block in the backward pass (less memory, ~1/3 slower)"
    )

    def check(self) -> None:
        from ..models import get_model_config

        try:
            get_model_config(self.name)
        except ValueError as e:
            raise ValueError(f"model.name: {e}") from None
        if self.checkpoint is not None and not pathlib.Path(self.checkpoint).is_file():
            raise ValueError(f"model.checkpoint={self.checkpoint!r}: no such file")


@dataclass
class DataCfg:
    dataset: Literal["folder", "fmnist"] = setting("folder", doc="folder (ImageNet layout: path/train, path/val)")
    path: Optional[str] = setting(
        None, doc="folder root, or the Fashion-MNIST folder (null: the Debian path)", resume=True
    )
    train_split: str = setting("train", doc="training subfolder of data.path")
    val_split: str = setting("val", doc="validation subfolder of data.path")
    img_size: Optional[int] = setting(None, gt=0, doc="null: the dataset's, else the model's input size")
    crop_pct: Optional[float] = setting(None, gt=0, le=1, doc="eval centre-crop fraction (null: the model's)")
    eval_resize: Literal["shorter", "squash"] = setting(
        "shorter",
        doc="eval resize before the centre crop: shorter (the shorter side to img_size / crop_pct, timm) "
        "or squash (the whole image to that square, the authors' Swin code base)",
    )
    interpolation: Optional[Literal["bicubic", "bilinear", "nearest"]] = setting(None, doc="null: the model's")
    mean: Optional[tuple[float, ...]] = setting(None, doc="per-channel mean (null: the dataset's or model's)")
    std: Optional[tuple[float, ...]] = setting(None, doc="per-channel std (null: the dataset's or model's)")
    batch_size: int = setting(128, ge=1, doc="images per process and micro-batch (the authors' per-GPU batch)")
    workers: int = setting(4, ge=0, doc="data loader processes", resume=True)
    subset: int = setting(
        0, ge=0, doc="use only the first N training images (0: all; N above the set's size is refused)"
    )
    val_subset: int = setting(
        0, ge=0, doc="use only the first N validation images (0: all; N above the set's size is refused)"
    )
    on_device: bool = setting(
        False, doc="keep an in-memory dataset (fmnist) on the training device: batches are gathered there"
    )

    def check(self) -> None:
        check_mean_std("data", self.mean, self.std)
        if self.on_device and self.dataset != "fmnist":
            raise ValueError(
                f"data.on_device=true keeps an in-memory dataset on the device: data.dataset must be fmnist, "
                f"got {self.dataset!r} (image folders are decoded by loader processes)"
            )


@dataclass
class AugCfg:
    crop: Literal["rrc", "pad", "none"] = setting("rrc", doc="random resized crop | pad-and-crop | none")
    scale: tuple[float, float] = setting((0.08, 1.0), doc="random resized crop area range")
    ratio: tuple[float, float] = setting((0.75, 1.3333333333333333), doc="random resized crop aspect range")
    padding: int = setting(4, ge=0, doc="pixels of padding for crop=pad")
    hflip: float = setting(0.5, ge=0, le=1, doc="horizontal flip probability")
    auto_augment: Optional[str] = setting("rand-m9-mstd0.5-inc1", doc="RandAugment policy 'rand-m<M>[-n<N>]', or null")
    color_jitter: Optional[float] = setting(0.4, ge=0, doc="used only without auto_augment (timm's rule)")
    re_prob: float = setting(0.25, ge=0, le=1, doc="random erasing probability")
    mixup: float = setting(0.8, ge=0, doc="mixup alpha (0: off)")
    cutmix: float = setting(1.0, ge=0, doc="cutmix alpha (0: off)")
    mixup_prob: float = setting(1.0, ge=0, le=1, doc="probability of mixing a batch")
    mixup_switch_prob: float = setting(0.5, ge=0, le=1, doc="probability of cutmix when both are on")
    smoothing: float = setting(0.1, ge=0, lt=1, doc="label smoothing")

    def check(self) -> None:
        for key in ("scale", "ratio"):
            lo, hi = getattr(self, key)
            if not 0 < lo <= hi:
                raise ValueError(f"aug.{key}={[lo, hi]}: expected 0 < low <= high")
        if self.scale[1] > 1:
            raise ValueError(f"aug.scale={list(self.scale)}: the area fraction cannot exceed 1")
        if self.auto_augment is not None:
            from ..data import parse_rand_augment

            try:
                parse_rand_augment(self.auto_augment)
            except ValueError as e:
                raise ValueError(f"aug.auto_augment={self.auto_augment!r}: {e}") from None


@dataclass
class ClassifyOptimCfg(OptimCfg, defaults={"clip_grad": 5.0}):
    base_lr: float = setting(5.0e-4, gt=0, doc=f"lr at a total batch of {LR_REFERENCE_BATCH} (when optim.lr is null)")
    accum_steps: int = setting(
        1, ge=1, doc="micro-batches per optimizer step (with total_batch: 1 or the number it implies)"
    )
    total_batch: Optional[int] = setting(
        None,
        ge=1,
        doc="images per optimizer step over all processes; accum_steps = total_batch / (data.batch_size "
        "x processes) must be a whole number (null: data.batch_size x processes x accum_steps)",
    )
    no_weight_decay: Optional[tuple[str, ...]] = setting(
        None,
        doc="parameter names (or last name components) exempt from weight decay besides 1-d parameters and "
        "biases, each matching a parameter of the model (null: the model's no_weight_decay(); []: none)",
    )
    layer_decay: Optional[float] = setting(
        None,
        gt=0,
        le=1,
        doc="layer-wise lr decay: layer l of L (the model's group_matcher: stem, blocks, head) trains at "
        "lr * layer_decay ** (L - 1 - l) (null: off)",
    )


@dataclass
class SchedCfg:
    epochs: int = setting(300, ge=1, doc="cosine epochs (warm-up included); cool-down epochs come after")
    warmup_epochs: float = setting(
        5.0, ge=0, at_most="sched.epochs", doc="linear warm-up epochs (fractions allowed, at most sched.epochs)"
    )
    cooldown_epochs: int = setting(10, ge=0, doc="epochs at min_lr after the cosine")
    # absolute beside an absolute optim.lr, else at the reference batch like optim.base_lr
    warmup_lr: float = setting(
        1.0e-6,
        ge=0,
        at_most=("optim.lr", "optim.base_lr"),
        doc=f"lr at the start of the warm-up, at a total batch of {LR_REFERENCE_BATCH} (scaled like base_lr)",
    )
    min_lr: float = setting(
        1.0e-5,
        ge=0,
        at_most=("optim.lr", "optim.base_lr"),
        doc=f"lr at the end of the cosine and in the cool-down, at a total batch "
        f"of {LR_REFERENCE_BATCH} (scaled like base_lr)",
    )


@dataclass
class TrainCfg(RunCfg):
    ema: bool = setting(False, doc="keep an exponential moving average of the weights")
    ema_decay: float = setting(
        0.9996, ge=0, lt=1, doc="EMA decay per optimizer step at a total batch of train.ema_batch"
    )
    ema_batch: Optional[int] = setting(
        4096,
        ge=1,
        doc="total batch at which ema_decay holds: the run uses ema_decay ** (total_batch / ema_batch), "
        "the same averaging horizon in images (null: ema_decay as is)",
    )
    eval_every: int = setting(1, ge=1, doc="evaluate every N epochs (and after the last)", resume=True)


@dataclass
class Config(TypedConfig):
    """A whole training config; ``Config()`` holds the defaults."""

    model: ModelCfg = field(default_factory=ModelCfg)
    data: DataCfg = field(default_factory=DataCfg)
    aug: AugCfg = field(default_factory=AugCfg)
    optim: ClassifyOptimCfg = field(default_factory=ClassifyOptimCfg)
    sched: SchedCfg = field(default_factory=SchedCfg)
    train: TrainCfg = field(default_factory=TrainCfg)

    @classmethod
    def sections(cls) -> dict[str, type]:
        return SECTIONS

    def check_processes(self, world_size: int) -> None:
        """The recipe (:func:`~inline_attn.train.recipe.resolve`): a total batch these processes
        cannot reach fails here."""
        from .recipe import resolve  # the recipe reads this module's constants

        resolve(self, world_size)


SECTIONS: dict[str, type] = {f.name: tp for f, tp in fields_of(Config)}  # the section classes, by name
FREEFORM = ("model.kwargs",)  # settings that take a mapping


def configs_dir() -> pathlib.Path:
    """The recipes folder: ``$INLINE_ATTN_CONFIGS``, ``./configs``, the source tree's
    ``configs/``, or the copy installed with the package (``inline_attn/configs``)."""
    package = pathlib.Path(__file__).resolve().parents[1]
    cands = [os.environ.get("INLINE_ATTN_CONFIGS"), "configs", package.parents[1] / "configs", package / "configs"]
    for c in cands:
        if c and (pathlib.Path(c) / DEMO_CONFIG).is_file():
            return pathlib.Path(c)
    raise ValueError(
        "cannot find the configs/ folder: run from the repository root, set INLINE_ATTN_CONFIGS, "
        "or pass the config file explicitly"
    )
