"""Fashion-MNIST from the IDX files of Debian's ``dataset-fashion-mnist`` package.

The files (gzipped or not) live in ``/usr/share/datasets/fashion-mnist/`` by default; the
directory can be overridden with an argument or the ``INLINE_ATTN_FMNIST`` environment variable.
IDX layout: 2 zero bytes, a type code (0x08 = uint8), the number of dims, then the dims as
big-endian int32, then the data.
"""

from __future__ import annotations

import gzip
import os
import pathlib
from typing import Optional, Union

import numpy as np
import torch

from .tensor import TensorImageDataset

DEFAULT_FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
FMNIST_MEAN = (0.2860,)
FMNIST_STD = (0.3530,)
FMNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
FMNIST_IMG_SIZE = 28
FMNIST_CROP_PCT = 1.0  # the images are used whole
FMNIST_NUM_CLASSES = len(FMNIST_CLASSES)
_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IDX_DTYPES = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
INSTALL_HINT = (
    "install it with `apt-get install -y dataset-fashion-mnist` (run `apt-get update` first if "
    "the package is not found), or point to a folder holding the IDX files with "
    "--data.path DIR / INLINE_ATTN_FMNIST=DIR"
)

PathLike = Union[str, os.PathLike]


def read_idx(path: PathLike) -> np.ndarray:
    """Read one IDX file (``.gz`` or raw) into an array of its declared dtype and shape."""
    path = pathlib.Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic {raw[:4]!r})")
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">i4", count=ndim, offset=4).astype(np.int64)
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    offset = 4 + 4 * ndim
    if len(raw) - offset != expected:
        raise ValueError(
            f"{path}: header says {tuple(dims)} ({expected} bytes) but the file holds {len(raw) - offset} bytes of data"
        )
    return np.frombuffer(raw, dtype=dtype, offset=offset).reshape(tuple(dims))


def fmnist_dir(root: Optional[PathLike] = None) -> pathlib.Path:
    """The Fashion-MNIST folder: ``root``, else ``$INLINE_ATTN_FMNIST``, else the Debian path."""
    return pathlib.Path(root or os.environ.get("INLINE_ATTN_FMNIST") or DEFAULT_FMNIST_DIR)


def _find(root: pathlib.Path, stem: str) -> pathlib.Path:
    for name in (stem + ".gz", stem):
        if (root / name).is_file():
            return root / name
    raise ValueError(f"Fashion-MNIST file {stem}[.gz] not found in {root}: {INSTALL_HINT}")


def load_fashion_mnist(root: Optional[PathLike] = None, split: str = "train") -> TensorImageDataset:
    """Fashion-MNIST ``split`` ("train": 60000 images, "test": 10000) as uint8 ``[N, 1, 28, 28]``."""
    split = {"val": "test", "t10k": "test"}.get(split, split)
    if split not in _FILES:
        raise ValueError(f"unknown Fashion-MNIST split {split!r}: expected 'train' or 'test'")
    root = fmnist_dir(root)
    if not root.is_dir():
        raise ValueError(f"Fashion-MNIST folder {root} does not exist: {INSTALL_HINT}")
    img_stem, lbl_stem = _FILES[split]
    images = read_idx(_find(root, img_stem))
    labels = read_idx(_find(root, lbl_stem))
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(
            f"Fashion-MNIST {split} files in {root} disagree: images {images.shape}, labels {labels.shape}"
        )
    return TensorImageDataset(
        torch.from_numpy(images.copy()).unsqueeze(1),
        torch.from_numpy(labels.astype(np.int64)),
        classes=FMNIST_CLASSES,
    )
