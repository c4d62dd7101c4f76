"""Models and images for the analyses: registry names, checkpoints or training runs, and data.

A model is a registered name (``create_model``) with optional constructor overrides and an
optional checkpoint. The checkpoint may be a file (ours, or a state dict, or a dict holding one
under ``model`` / ``state_dict``) or a training run folder; either is rebuilt by the trainer's own
loader (:func:`inline_attn.train.load_trained_model`), which knows the model's name, constructor
arguments and input normalisation from the checkpoint or the run's ``config.yaml``.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn as nn

from ..runtime.finite import require_finite_weights

PathLike = Union[str, os.PathLike]


@dataclass
class LoadedModel:
    """A model ready for analysis and how to feed it."""

    label: str
    model: nn.Module
    name: str
    img_size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_pct: float
    interpolation: str
    in_chans: int
    checkpoint: Optional[str] = None
    kwargs: dict = field(default_factory=dict)


def parse_model_args(items: Optional[Sequence[str]]) -> dict:
    """``["key=value", ...]`` -> dict (values parsed as YAML: ``depth=2``, ``pattern=L``)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items or ():
        if "=" not in item:
            raise ValueError(f"model argument {item!r}: expected key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v) if v.strip() else ""
    return out


def _model_size(model: nn.Module, kwargs: dict, cfg) -> tuple[int, int]:
    size = kwargs.get("img_size")
    if size is None:
        pe = getattr(model, "patch_embed", None)
        size = getattr(pe, "img_size", None)
    if size is None:
        size = cfg.input_size[-2:]
    return (int(size), int(size)) if isinstance(size, (int, float)) else (int(size[0]), int(size[1]))


def _in_chans(model: nn.Module, cfg) -> int:
    try:
        return int(model.get_submodule(cfg.first_conv).in_channels)
    except (AttributeError, TypeError):
        return int(cfg.input_size[0])


def load_model(
    name: Optional[str],
    checkpoint: Optional[PathLike] = None,
    *,
    model_args: Optional[dict] = None,
    label: Optional[str] = None,
) -> LoadedModel:
    """Build ``name`` (or the checkpoint's model when ``name`` is None) and load its weights.

    A checkpoint (file or training run folder) is rebuilt as the trainer built it, by
    :func:`inline_attn.train.load_trained_model`, and fed with the input size and normalisation
    it trained with; ``model_args`` override the constructor arguments. Without one, the
    registered model with ``model_args`` and its own input statistics.
    """
    from ..data import resolve_data_info
    from ..models import create_model, get_model_config

    kwargs = dict(model_args or {})
    info = None
    ckpt_file = None
    if checkpoint is not None:
        from ..train.evaluate import load_trained_model, trained_data_info

        model, record = load_trained_model(checkpoint, model=name, **kwargs)
        name, kwargs, ckpt_file = record["model_name"], record["model_kwargs"], record["path"]
        require_finite_weights(model, f"checkpoint {ckpt_file}")
        if record.get("config"):  # the run's data settings are known
            info = trained_data_info(record)
    elif name is None:
        raise ValueError("no model name: pass --model NAME (or a run folder whose config.yaml names it)")
    else:
        model = create_model(name, **kwargs)
    cfg = get_model_config(name)
    model.eval()
    in_chans = _in_chans(model, cfg)
    if info is None:
        info = resolve_data_info(cfg, fmnist=False)
        if in_chans == 1 and len(info.mean) > 1:  # an RGB recipe's statistics for a one-channel model
            info = replace(info, mean=(sum(cfg.mean) / len(cfg.mean),), std=(sum(cfg.std) / len(cfg.std),))
    return LoadedModel(
        label=label or name,
        model=model,
        name=name,
        img_size=_model_size(model, kwargs, cfg),
        mean=tuple(info.mean),
        std=tuple(info.std),
        crop_pct=float(info.crop_pct),
        interpolation=str(info.interpolation),
        in_chans=in_chans,
        checkpoint=str(ckpt_file) if ckpt_file else None,
        kwargs=kwargs,
    )


@dataclass
class ImageSet:
    """Evaluation images (uint8 [N, C, H, W]) and labels ([N]) as read, before normalisation;
    ``num_classes``: the classes of the data they were taken from (None: not known)."""

    images: torch.Tensor
    labels: torch.Tensor
    source: str
    num_classes: Optional[int] = None


def load_images(
    data: PathLike,
    *,
    num_images: int = 0,
    setting: Optional[str] = "--num-images",
    img_size: int = 224,
    crop_pct: float = 0.875,
    interpolation: str = "bicubic",
    split: str = "val",
    indices: Optional[Sequence[int]] = None,
) -> ImageSet:
    """``data`` = "fmnist" (Fashion-MNIST test split; "fmnist:DIR" for another folder of IDX
    files) or an ImageNet-layout folder (its ``val/`` subfolder when present). ``num_images``:
    the first N images (0: all; folders: N spread over the classes), as the option ``setting``
    asked for them: more than the data holds is a ValueError naming both numbers (None: ``num_images``
    is a default count, and a smaller data set gives all its images); ``indices``: exactly these
    images instead. Folder images are decoded with the eval crop at ``img_size``."""
    from ..data import ImageFolder, folder_split, load_fashion_mnist, parse_source

    fmnist, root = parse_source(data)
    if fmnist:
        ds = load_fashion_mnist(root, split="test")
        if indices is not None:
            idx = _check_indices(indices, len(ds))
            return ImageSet(ds.images[idx], ds.labels[idx], "Fashion-MNIST test", ds.num_classes)
        n = _image_count(num_images, len(ds), "Fashion-MNIST's test split", setting)
        return ImageSet(ds.images[:n], ds.labels[:n], "Fashion-MNIST test", ds.num_classes)
    if not pathlib.Path(root).is_dir():
        raise ValueError(f"--data {root!r}: expected 'fmnist' or an ImageNet-layout folder")
    root = folder_split(root, split, what="--data")
    folder = ImageFolder(root, img_size, train=False, crop_pct=crop_pct, interpolation=interpolation)
    n = _image_count(num_images, len(folder), f"--data {root}", setting)
    # evenly spread over the (class-sorted) samples, so a small N still covers the classes
    idx = torch.linspace(0, len(folder) - 1, n).round().long().unique() if n < len(folder) else torch.arange(n)
    if indices is not None:
        idx = _check_indices(indices, len(folder))
    items = [folder[int(i)] for i in idx]
    items = [(im, t) for im, t in items if im is not None]  # unreadable images are left out (and logged)
    if not items:
        raise ValueError(f"--data {root}: none of the chosen images could be read")
    images, labels = torch.stack([im for im, _ in items]), torch.tensor([t for _, t in items])
    return ImageSet(images, labels, str(root), folder.num_classes)


def _image_count(num_images: int, size: int, what: str, setting: Optional[str]) -> int:
    """How many of the ``size`` images of ``what`` to take (``num_images`` <= 0: all); a count asked
    for by ``setting`` and larger than the data is refused (subset_size); with no ``setting`` it is
    a default and takes at most ``size``."""
    if num_images <= 0:
        return size
    if setting is None:
        return min(num_images, size)
    from ..data.subset import subset_size

    return subset_size(num_images, size, what, setting=setting, split="evaluation")


def _check_indices(indices: Sequence[int], n: int) -> torch.Tensor:
    bad = [i for i in indices if not 0 <= int(i) < n]
    if bad:
        raise ValueError(f"image indices {bad} out of range: the data has {n} images")
    return torch.tensor([int(i) for i in indices], dtype=torch.long)


def prepare(images: torch.Tensor, lm: LoadedModel) -> torch.Tensor:
    """uint8 / [0, 1] images -> the model's normalised input (channels matched, eval resize)."""
    from ..data import EvalTransform
    from ..data.transforms import to_float

    x = to_float(images)  # [0, 1]
    c = x.shape[1]
    if c != lm.in_chans:
        if c == 1:
            x = x.expand(-1, lm.in_chans, -1, -1)
        elif lm.in_chans == 1:
            x = x.mean(dim=1, keepdim=True)
        else:
            raise ValueError(f"images have {c} channels, model {lm.label} takes {lm.in_chans}")
    h, w = lm.img_size
    if h != w:
        raise ValueError(f"model {lm.label}: non-square input {lm.img_size} is not supported by the eval crop")
    return EvalTransform(h, lm.mean, lm.std, lm.crop_pct, lm.interpolation)(x)


def display_images(images: torch.Tensor, lm: LoadedModel) -> torch.Tensor:
    """The images as the model sees them (same crop), un-normalised to [0, 1] for plotting."""
    x = prepare(images, lm)
    mean = torch.tensor(lm.mean).view(1, -1, 1, 1)
    std = torch.tensor(lm.std).view(1, -1, 1, 1)
    return (x * std + mean).clamp(0, 1)


class ImageBatches:
    """Iterable of (normalised x [b, C, H, W], labels [b]) over an :class:`ImageSet` for one model."""

    def __init__(self, images: ImageSet, lm: LoadedModel, batch_size: int = 64):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.images, self.lm, self.batch_size = images, lm, batch_size

    def __len__(self) -> int:
        return -(-len(self.images.labels) // self.batch_size)

    def __iter__(self):
        for s in range(0, len(self.images.labels), self.batch_size):
            sl = slice(s, s + self.batch_size)
            yield prepare(self.images.images[sl], self.lm), self.images.labels[sl]
