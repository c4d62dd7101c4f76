"""Training configs: defaults here, a YAML file on top, ``--section.key value`` overrides last.

The default tree below lists every key the engine understands; a YAML file or an override that
names another key is an error (``model.kwargs`` is the exception: free-form constructor
arguments for :func:`inline_attn.create_model`).
"""
from __future__ import annotations

import copy
import difflib
import os
import pathlib
import re
from typing import Any, Iterable, Optional, Union

import yaml

DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {
        "name": "inline_deit_tiny",
        "kwargs": {},            # constructor overrides (img_size, pattern, depth, ...)
        "drop_path": 0.1,
        "drop": 0.0,
        "checkpoint": None,      # initial weights (fine-tuning), loaded non-strictly for the head
    },
    "data": {
        "dataset": "folder",     # folder (ImageNet layout: path/train, path/val) | fmnist
        "path": None,            # folder root, or the Fashion-MNIST folder (None: the Debian path)
        "train_split": "train",
        "val_split": "val",
        "img_size": None,        # None: the model's input size
        "crop_pct": None,        # None: the model's
        "interpolation": None,   # None: the model's
        "mean": None,
        "std": None,
        "batch_size": 128,       # per process
        "workers": 4,
        "subset": 0,             # use only the first N training images (0: all)
        "val_subset": 0,
    },
    "aug": {
        "crop": "rrc",           # rrc | pad | none
        "scale": [0.08, 1.0],
        "ratio": [0.75, 1.3333333333333333],
        "padding": 4,
        "hflip": 0.5,
        "auto_augment": "rand-m9-mstd0.5-inc1",
        "color_jitter": 0.4,     # used only without auto_augment (timm's rule)
        "re_prob": 0.25,
        "mixup": 0.8,
        "cutmix": 1.0,
        "mixup_prob": 1.0,
        "mixup_switch_prob": 0.5,
        "smoothing": 0.1,
    },
    "optim": {
        "opt": "adamw",
        "lr": None,              # absolute lr; None: base_lr * total_batch / 512
        "base_lr": 5.0e-4,
        "weight_decay": 0.05,
        "betas": [0.9, 0.999],
        "eps": 1.0e-8,
        "clip_grad": 5.0,        # max grad norm; None/0: off
        "accum_steps": 1,
    },
    "sched": {
        "epochs": 300,           # cosine epochs (warm-up included); cool-down epochs come after
        "warmup_epochs": 5,
        "cooldown_epochs": 10,
        "warmup_lr": 1.0e-6,
        "min_lr": 1.0e-5,
    },
    "train": {
        "output": "runs/train",
        "seed": 0,
        "deterministic": False,
        "device": "auto",        # auto | cpu | cuda
        "amp": "none",           # none | bf16 | fp16 (CUDA only, with a GradScaler) | auto (fp16 on CUDA)
        "compile": False,        # torch.compile the model (the fused InLine op compiles as one node)
        "channels_last": False,  # channels-last images and convolutions
        "ema": False,
        "ema_decay": 0.9998,
        "resume": None,          # None | auto | path to a checkpoint
        "eval_every": 1,
        "max_steps": 0,          # stop (and checkpoint) after this many optimizer steps (0: no limit)
        "progress": True,
        "threads": 0,            # torch threads (0: leave as is)
        "tensorboard": True,     # used when tensorboard is installed
    },
}

_FREEFORM = {("model", "kwargs")}


def _suggest(key: str, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(options), n=3)
    return f" (did you mean {', '.join(close)}?)" if close else f" (known: {', '.join(sorted(options))})"


def merge(base: dict, update: dict, prefix: str = "") -> dict:
    """Recursive merge of ``update`` into a copy of ``base``; unknown keys raise ValueError."""
    out = copy.deepcopy(base)
    for k, v in (update or {}).items():
        path = f"{prefix}{k}"
        if k not in out:
            raise ValueError(f"unknown config key {path!r}{_suggest(k, out)}")
        if isinstance(out[k], dict) and tuple(path.split(".")) not in _FREEFORM:
            if not isinstance(v, dict):
                raise ValueError(f"config key {path!r} is a section: expected a mapping, got {v!r}")
            out[k] = merge(out[k], v, path + ".")
        elif tuple(path.split(".")) in _FREEFORM:
            if not isinstance(v, dict):
                raise ValueError(f"config key {path!r} expects a mapping, got {v!r}")
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def parse_value(text: str) -> Any:
    """A command-line value as YAML (so ``0.1``, ``true``, ``[1, 2]``, ``null`` work), with
    YAML 1.1's gap fixed: ``1e-3`` (no dot) is read as a float, not a string."""
    if re.fullmatch(r"[+-]?\d+(\.\d*)?[eE][+-]?\d+", text.strip()):
        return float(text)
    return yaml.safe_load(text) if text.strip() else ""


def set_dotted(cfg: dict, key: str, value: Any) -> None:
    """``cfg["a"]["b"] = value`` for ``key = "a.b"``; ``model.kwargs.<name>`` may be new."""
    parts = key.split(".")
    node = cfg
    for i, p in enumerate(parts[:-1]):
        if tuple(parts[:i + 1]) in _FREEFORM:
            node = node.setdefault(p, {})
            for q in parts[i + 1:-1]:
                node = node.setdefault(q, {})
            node[parts[-1]] = value
            return
        if p not in node or not isinstance(node[p], dict):
            sections = [k for k, v in node.items() if isinstance(v, dict)]
            raise ValueError(f"unknown config key {key!r}{_suggest(p, sections)}")
        node = node[p]
    last = parts[-1]
    if last not in node:
        raise ValueError(f"unknown config key {key!r}{_suggest(last, node)}")
    if isinstance(node[last], dict) and tuple(parts) not in _FREEFORM:
        raise ValueError(f"config key {key!r} is a section; set one of its keys ({', '.join(node[last])})")
    node[last] = value


def parse_overrides(items: list[str]) -> list[tuple[str, Any]]:
    """``["--optim.lr", "1e-3", "--train.ema=true"]`` -> ``[("optim.lr", 0.001), ("train.ema", True)]``."""
    out = []
    i = 0
    while i < len(items):
        tok = items[i]
        if not tok.startswith("--") or len(tok) <= 2:
            raise ValueError(f"unexpected argument {tok!r}: overrides look like --section.key VALUE")
        key = tok[2:]
        if "=" in key:
            key, val = key.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(items):
                raise ValueError(f"override {tok!r} has no value")
            val = items[i + 1]
            i += 2
        out.append((key.replace("-", "_") if "." not in key else key, parse_value(val)))
    return out


def load_config(path: Optional[Union[str, os.PathLike]] = None, overrides: Iterable[tuple[str, Any]] = ()) -> dict:
    """DEFAULTS <- YAML file (``_base_: other.yaml`` is followed first) <- overrides."""
    cfg = copy.deepcopy(DEFAULTS)
    if path is not None:
        cfg = merge(cfg, read_yaml(path))
    for key, value in overrides:
        set_dotted(cfg, key, value)
    return cfg


def read_yaml(path: Union[str, os.PathLike]) -> dict:
    """A YAML config as a dict, following ``_base_`` (a path relative to this file) recursively."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"config file {path} does not exist")
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping, got {type(data).__name__}")
    base = data.pop("_base_", None)
    if base is not None:
        data = merge_free(read_yaml(path.parent / base), data)
    return data


def merge_free(base: dict, update: dict) -> dict:
    """Recursive dict merge without key checks (for ``_base_`` chains; checked later)."""
    out = copy.deepcopy(base)
    for k, v in update.items():
        out[k] = merge_free(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def save_config(cfg: dict, path: Union[str, os.PathLike]) -> None:
    """Write the resolved config as YAML (floats keep a dot so YAML 1.1 reads them back as floats)."""
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False, default_flow_style=None)
