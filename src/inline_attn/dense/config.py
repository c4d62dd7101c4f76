"""Segmentation configs: the defaults below, a YAML file on top (``_base_`` chains), then
``--section.key VALUE`` overrides. Unknown keys are errors; ``model.backbone_kwargs`` is free-form
(arguments of :class:`~inline_attn.dense.DenseBackbone` / :func:`inline_attn.create_model`).

The defaults are the paper's ADE20K Semantic FPN recipe (PVT's: 512 x 512 crops, 16 images per
step over 8 GPUs, AdamW lr 2e-4, weight decay 1e-4, poly decay of power 0.9 over 40k iterations).
"""

from __future__ import annotations

import copy
import difflib
import os
from typing import Any, Iterable, Optional, Union

import yaml

from .._io import atomic_write_text
from ..train.config import parse_value, read_yaml

__all__ = [
    "DET_DEFAULTS",
    "SEG_DEFAULTS",
    "load_det_config",
    "load_seg_config",
    "parse_value",
    "save_config",
    "set_key",
]

ADE_MEAN = [123.675, 116.28, 103.53]  # ImageNet mean / std in 0-255 units (RGB), as mmseg
ADE_STD = [58.395, 57.12, 57.375]

SEG_DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {
        "decode": "semantic_fpn",  # semantic_fpn | upernet
        "backbone": "inline_pvt_tiny",
        "backbone_kwargs": {},  # free-form: pattern, embed_dims, depths, out_norms, ...
        "pretrained": None,  # classification checkpoint (ours or the authors') for the backbone
        "checkpoint": None,  # whole-segmentor weights to start from
        "drop_path": None,  # backbone stochastic depth (None: the variant's default)
        "frozen_stages": -1,
        "norm_eval": False,
        "channels": None,  # decode head width (None: 128 semantic_fpn, 512 upernet)
        "neck_channels": 256,
        "aux_weight": None,  # None: 0 for semantic_fpn, 0.4 for upernet (FCN head on stride 16)
        "aux_channels": 256,
        "dropout": 0.1,
        "num_classes": None,  # None: the dataset's (150 ADE20K, 11 mosaics)
        "ignore_index": 255,
        "avg_non_ignore": False,
    },
    "data": {
        "dataset": "ade20k",  # ade20k (ADEChallengeData2016 layout) | mosaic (Fashion-MNIST mosaics)
        "path": None,  # ADE20K root, or the Fashion-MNIST folder for mosaics (None: Debian's)
        "reduce_zero_label": True,
        "crop_size": [512, 512],
        "scale": [2048, 512],  # RandomResize / test Resize target (long, short) edge
        "ratio_range": [0.5, 2.0],
        "cat_max_ratio": 0.75,
        "flip": 0.5,
        "photometric": True,
        "mean": ADE_MEAN,
        "std": ADE_STD,
        "batch_size": 2,  # per process
        "workers": 2,
        "val_subset": 0,  # evaluate on the first N validation images (0: all)
        "mosaic": {
            "size": 64,
            "train": 4000,
            "val": 300,
            "seed": 0,
            "pool": 0,
            "objects": [2, 3],
            "scale": [1.0, 1.0],
            "noise": 0.05,
            "max_overlap": 0.15,
        },
    },
    "optim": {
        "opt": "adamw",
        "lr": 2.0e-4,
        "weight_decay": 1.0e-4,
        "betas": [0.9, 0.999],
        "eps": 1.0e-8,
        "clip_grad": None,
    },
    "sched": {
        "iters": 40000,
        "warmup_iters": 0,
        "warmup_ratio": 1.0e-6,  # warm-up starts at lr * warmup_ratio (linear)
        "power": 0.9,
        "min_lr": 0.0,
    },
    "eval": {
        "mode": "whole",  # whole | slide
        "crop_size": [512, 512],
        "stride": [341, 341],
        "flip": False,
        "interval": 4000,  # evaluate every N iterations (and at the end); 0: only at the end
        "batch_size": 1,
    },
    "train": {
        "output": "runs/seg",
        "seed": 0,
        "device": "auto",
        "amp": "none",  # none | bf16 | fp16 (CUDA) | auto (fp16 on CUDA)
        "resume": None,  # None | auto | path
        "checkpoint_interval": 4000,
        "max_steps": 0,  # stop (with a checkpoint) after this many iterations (0: no limit)
        "log_interval": 50,
        "progress": True,
        "threads": 0,
        "deterministic": False,
        "predictions_png": True,  # a PNG of validation predictions beside the ground truth
    },
}

# The detector's recipe (FCOS, Tian et al. 2019: 4 tower convs, centre sampling radius 1.5,
# focal alpha 0.25 / gamma 2, NMS 0.6, 100 detections) on the same backbone, data, optimiser,
# schedule and run settings as segmentation; data.dataset "coco" reads an instances JSON.
DET_DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {
        "backbone": "inline_pvt_tiny",
        "backbone_kwargs": {},
        "pretrained": None,
        "checkpoint": None,
        "drop_path": None,
        "frozen_stages": -1,
        "norm_eval": False,
        "neck_channels": 256,
        "head_channels": None,  # None: neck_channels
        "num_convs": 4,
        "range_scale": 8.0,  # level l takes objects whose largest point-to-side distance is in [8 s_{l-1}, 8 s_l)
        "center_radius": 1.5,
        "focal_alpha": 0.25,
        "focal_gamma": 2.0,
        "score_threshold": 0.05,
        "pre_nms": 1000,
        "nms_iou": 0.6,
        "max_per_image": 100,
        "num_classes": None,  # None: the dataset's (10 mosaics, the JSON's categories for COCO)
    },
    "data": {
        "dataset": "mosaic",  # mosaic | coco
        "path": None,  # the Fashion-MNIST folder for mosaics (None: Debian's)
        "coco": {
            "train_ann": None,  # instances_train2017.json
            "train_images": None,  # its image folder
            "val_ann": None,
            "val_images": None,
            "short_size": 800,  # images resized to short side 800, long side <= 1333 (mmdet's 1x scale)
            "max_size": 1333,
        },
        "flip": 0.5,
        "mean": ADE_MEAN,
        "std": ADE_STD,
        "batch_size": 2,
        "workers": 0,
        "val_subset": 0,
        "mosaic": copy.deepcopy(SEG_DEFAULTS["data"]["mosaic"]),
    },
    "optim": copy.deepcopy(SEG_DEFAULTS["optim"]),
    "sched": copy.deepcopy(SEG_DEFAULTS["sched"]),
    "eval": {"interval": 4000, "batch_size": 8},
    "train": dict(copy.deepcopy(SEG_DEFAULTS["train"]), output="runs/det"),
}

_FREEFORM = {("model", "backbone_kwargs")}


def _suggest(key: str, options) -> str:
    close = difflib.get_close_matches(key, list(options), n=3)
    return f" (did you mean {', '.join(close)}?)" if close else f" (known: {', '.join(sorted(options))})"


def _merge(base: dict, update: dict, prefix: tuple = ()) -> dict:
    out = copy.deepcopy(base)
    for k, v in (update or {}).items():
        path = prefix + (k,)
        if k not in out:
            raise ValueError(f"unknown config key {'.'.join(path)!r}{_suggest(k, out)}")
        if path in _FREEFORM:
            if not isinstance(v, dict):
                raise ValueError(f"config key {'.'.join(path)!r} expects a mapping, got {v!r}")
            out[k] = {**out[k], **v}
        elif isinstance(out[k], dict):
            if not isinstance(v, dict):
                raise ValueError(f"config key {'.'.join(path)!r} is a section: expected a mapping, got {v!r}")
            out[k] = _merge(out[k], v, path)
        else:
            out[k] = v
    return out


def set_key(cfg: dict, key: str, value: Any) -> None:
    """``cfg[a][b] = value`` for ``key = "a.b"`` (keys under ``model.backbone_kwargs`` may be new)."""
    parts = tuple(key.split("."))
    node = cfg
    for i, p in enumerate(parts[:-1]):
        if parts[: i + 1] in _FREEFORM:
            node = node.setdefault(p, {})
            for q in parts[i + 1 : -1]:
                node = node.setdefault(q, {})
            node[parts[-1]] = value
            return
        if not isinstance(node.get(p), dict):
            raise ValueError(
                f"unknown config key {key!r}{_suggest(p, [k for k, v in node.items() if isinstance(v, dict)])}"
            )
        node = node[p]
    if parts[-1] not in node:
        raise ValueError(f"unknown config key {key!r}{_suggest(parts[-1], node)}")
    if isinstance(node[parts[-1]], dict) and parts not in _FREEFORM:
        raise ValueError(f"config key {key!r} is a section; set one of its keys ({', '.join(node[parts[-1]])})")
    node[parts[-1]] = value


def load_seg_config(path: Optional[Union[str, os.PathLike]] = None, overrides: Iterable[tuple[str, Any]] = ()) -> dict:
    """SEG_DEFAULTS <- YAML file (following ``_base_``) <- overrides (dotted keys)."""
    return load_config(SEG_DEFAULTS, path, overrides)


def load_det_config(path: Optional[Union[str, os.PathLike]] = None, overrides: Iterable[tuple[str, Any]] = ()) -> dict:
    """DET_DEFAULTS <- YAML file (following ``_base_``) <- overrides (dotted keys)."""
    return load_config(DET_DEFAULTS, path, overrides)


def load_config(defaults: dict, path=None, overrides: Iterable[tuple[str, Any]] = ()) -> dict:
    """``defaults`` <- YAML file (following ``_base_``) <- overrides (dotted keys)."""
    cfg = copy.deepcopy(defaults)
    if path is not None:
        cfg = _merge(cfg, read_yaml(path))
    for key, value in overrides:
        set_key(cfg, key, value)
    return cfg


def flat_keys(tree: dict = SEG_DEFAULTS, prefix: str = "") -> list[tuple[str, Any]]:
    """Every settable dotted key with its default (for the command line's help)."""
    out = []
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and tuple(key.split(".")) not in _FREEFORM:
            out += flat_keys(v, key + ".")
        else:
            out.append((key, v))
    return out


def save_config(cfg: dict, path) -> None:
    """Write the resolved config as YAML, atomically."""
    atomic_write_text(path, yaml.safe_dump(cfg, sort_keys=False, default_flow_style=None))
