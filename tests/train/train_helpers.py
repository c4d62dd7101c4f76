"""Small fixtures for the training tests: generated ImageNet-layout folders and IDX files."""

from __future__ import annotations

import gzip
import pathlib
import struct

import numpy as np
from PIL import Image

TINY_DEIT = {"patch_size": 4, "embed_dim": 16, "depth": 1, "num_heads": 2}


def write_idx(path: pathlib.Path, arr: np.ndarray) -> None:
    """Write a uint8 array as a gzipped IDX file (the Fashion-MNIST format)."""
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(struct.pack(">i", d) for d in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


def make_fmnist(root: pathlib.Path, n_train: int = 16, n_test: int = 8, seed: int = 0) -> pathlib.Path:
    """Fashion-MNIST-format files: 28 x 28 images whose brightness encodes the class."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("t10k", n_test)):
        labels = np.arange(n) % 10
        imgs = (labels[:, None, None] * 25 + rng.integers(0, 20, (n, 28, 28))).astype(np.uint8)
        write_idx(root / f"{split}-images-idx3-ubyte.gz", imgs)
        write_idx(root / f"{split}-labels-idx1-ubyte.gz", labels.astype(np.uint8))
    return root


def make_folder(
    root: pathlib.Path, classes=("cat", "dog", "fox"), per_class: int = 4, seed: int = 0, size=(20, 24)
) -> pathlib.Path:
    """An ImageNet-layout folder (train/ and val/) of small RGB PNGs, colour-coded by class."""
    rng = np.random.default_rng(seed)
    for split in ("train", "val"):
        for ci, c in enumerate(classes):
            d = root / split / c
            d.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                arr = rng.integers(0, 60, (size[0], size[1], 3)).astype(np.uint8)
                arr[..., ci % 3] += 150
                Image.fromarray(arr).save(d / f"{i}.png")
    return root


def base_overrides(out: pathlib.Path, **extra) -> list:
    """Overrides for a tiny, quick, deterministic CPU run (no augmentation unless asked)."""
    ov = {
        "model.name": "inline_deit_tiny",
        "model.kwargs": dict(TINY_DEIT),
        "model.drop_path": 0.0,
        "data.batch_size": 4,
        "data.workers": 0,
        "aug.crop": "none",
        "aug.hflip": 0.0,
        "aug.auto_augment": None,
        "aug.color_jitter": None,
        "aug.re_prob": 0.0,
        "aug.mixup": 0.0,
        "aug.cutmix": 0.0,
        "aug.smoothing": 0.0,
        "optim.lr": 1.0e-3,
        "sched.epochs": 1,
        "sched.warmup_epochs": 0,
        "sched.cooldown_epochs": 0,
        "train.output": str(out),
        "train.progress": False,
        "train.deterministic": True,
        "train.tensorboard": False,
    }
    ov.update(extra)
    return list(ov.items())
