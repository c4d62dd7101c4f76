"""Where data comes from and how a model is fed it: one rule for training, evaluation and analysis.

- :func:`resolve_data_info`: input size, normalisation and crop settings are the config's (or
  the caller's), else the dataset's (Fashion-MNIST's), else the model's.
- :func:`parse_source`: ``"fmnist"``, ``"fmnist:DIR"`` or an ImageNet-layout folder.
- :func:`folder_split`: a split subfolder (``val/``), or the folder itself when it holds class
  folders directly.
- :func:`check_class_count`: a classifier's head and the data it is trained or scored on hold the
  same number of classes.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from .fmnist import FMNIST_CROP_PCT, FMNIST_IMG_SIZE, FMNIST_MEAN, FMNIST_NUM_CLASSES, FMNIST_STD, load_fashion_mnist
from .folder import ImageFolder

PathLike = Union[str, os.PathLike]
# subfolder names that mark a folder as split (train/ val/ ...) rather than one split of classes
SPLIT_NAMES = ("train", "val", "validation", "test")

__all__ = [
    "DataInfo",
    "SPLIT_NAMES",
    "check_class_count",
    "folder_split",
    "open_eval_source",
    "parse_source",
    "resolve_data_info",
]


@dataclass(frozen=True)
class DataInfo:
    """How a model is fed: class count, channels, input size, normalisation, eval resize and crop."""

    num_classes: Optional[int]
    in_chans: int
    img_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_pct: float
    interpolation: str
    eval_resize: str = "shorter"

    def with_classes(self, num_classes: int) -> "DataInfo":
        return dataclasses.replace(self, num_classes=int(num_classes))


def check_class_count(model_classes: int, data_classes: int, *, model: str, data: str) -> None:
    """Refuses a classifier whose head predicts another number of classes than the data holds (its
    labels would be scored against the wrong outputs, or index past them). ``model`` names where the
    model's count comes from (``"model.kwargs.num_classes"``), ``data`` the data. Checkpoints keep
    no class names, so only the count can be compared: a model of the same count trained on other
    classes is not caught."""
    if int(model_classes) != int(data_classes):
        raise ValueError(f"{model}={model_classes} but {data} has {data_classes} classes")


def resolve_data_info(
    model_cfg,
    *,
    fmnist: bool,
    num_classes: Optional[int] = None,
    img_size: Optional[int] = None,
    mean: Optional[Sequence[float]] = None,
    std: Optional[Sequence[float]] = None,
    crop_pct: Optional[float] = None,
    interpolation: Optional[str] = None,
    eval_resize: Optional[str] = None,
) -> DataInfo:
    """The given values, else Fashion-MNIST's (``fmnist``), else the model's (a ``ModelConfig``);
    ``eval_resize`` defaults to "shorter" (timm's).

    ``num_classes`` defaults to Fashion-MNIST's 10 for ``fmnist`` and stays None for folders
    (known once the folder is read: :meth:`DataInfo.with_classes`).
    """
    mean = tuple(mean or (FMNIST_MEAN if fmnist else model_cfg.mean))
    std = tuple(std or (FMNIST_STD if fmnist else model_cfg.std))
    if len(mean) != len(std):
        raise ValueError(f"mean {mean} and std {std} give different channel counts")
    return DataInfo(
        num_classes=num_classes if num_classes is not None else (FMNIST_NUM_CLASSES if fmnist else None),
        in_chans=len(mean),
        img_size=int(img_size or (FMNIST_IMG_SIZE if fmnist else model_cfg.input_size[-1])),
        mean=mean,
        std=std,
        crop_pct=float(crop_pct or (FMNIST_CROP_PCT if fmnist else model_cfg.crop_pct)),
        interpolation=str(interpolation or model_cfg.interpolation),
        eval_resize=str(eval_resize or "shorter"),
    )


def parse_source(spec: PathLike) -> tuple[bool, Optional[str]]:
    """``"fmnist"`` -> (True, None); ``"fmnist:DIR"`` -> (True, DIR); a folder -> (False, folder)."""
    spec = str(spec)
    if spec == "fmnist" or spec.startswith("fmnist:"):
        return True, (spec[len("fmnist:") :] or None)
    return False, spec


def folder_split(path: Optional[PathLike], split: str, *, what: str = "data.path") -> pathlib.Path:
    """``path/split`` when it exists, else ``path`` itself when it holds class folders directly.

    A folder that is split (it has ``train/``, ``val/``, ...) but lacks ``split`` is an error
    naming what it has; ``what`` names the setting in messages.
    """
    if path is None:
        raise ValueError(f"{what} is required: an ImageNet-layout folder (train/<class>/*, val/<class>/*)")
    root = pathlib.Path(path)
    if not root.is_dir():
        raise ValueError(f"data folder {root} does not exist ({what})")
    if (root / split).is_dir():
        return root / split
    present = sorted(d.name for d in root.iterdir() if d.is_dir() and d.name.lower() in SPLIT_NAMES)
    if present:
        raise ValueError(
            f"data folder {root} has no {split}/ split (it has {', '.join(p + '/' for p in present)}); "
            f"create {root / split} or name another split"
        )
    return root


def open_eval_source(spec: PathLike, info: DataInfo, split: Optional[str] = None, *, what: str = "--data"):
    """The evaluation images of ``spec`` (see :func:`parse_source`) -> (dataset, is_fmnist)."""
    fmnist, root = parse_source(spec)
    if fmnist:
        return load_fashion_mnist(root, split or "test"), True
    folder = folder_split(root, split or "val", what=what)
    return ImageFolder(
        folder,
        info.img_size,
        train=False,
        crop_pct=info.crop_pct,
        interpolation=info.interpolation,
        eval_resize=info.eval_resize,
    ), False
