"""An in-memory image dataset: uint8 images ``[N, C, H, W]`` and int64 labels ``[N]``."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch.utils.data import Dataset

from .subset import subset_size


class TensorImageDataset(Dataset):
    """Images already decoded into one uint8 tensor; batches are gathered by indexing."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, classes: Optional[Sequence[str]] = None):
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"images must be uint8 [N, C, H, W], got {images.dtype} {tuple(images.shape)}")
        if labels.shape != (images.shape[0],):
            raise ValueError(f"labels {tuple(labels.shape)} do not match {images.shape[0]} images")
        self.images = images
        self.labels = labels.long()
        self.classes = list(classes) if classes is not None else [str(i) for i in range(int(labels.max()) + 1)]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, i):
        return self.images[i], self.labels[i]

    def batch(self, idx: torch.Tensor):
        """images ``[b, C, H, W]`` and labels ``[b]`` for the indices ``idx``."""
        return self.images[idx], self.labels[idx.to(self.labels.device)]

    def to(self, device) -> "TensorImageDataset":
        """The same samples on ``device`` (Fashion-MNIST's 60k images are 47 MB: a GPU holds them and
        gathers each batch without a host copy)."""
        return TensorImageDataset(self.images.to(device), self.labels.to(device), self.classes)

    def subset(self, n: int, what: str, *, setting: str, split: str) -> "TensorImageDataset":
        """The first ``n`` samples (0: all), as the option ``setting`` asked for them from the
        ``split`` set ``what``: an ``n`` larger than the set is a ValueError naming both numbers
        (:func:`~inline_attn.data.subset.subset_size`)."""
        n = subset_size(n, len(self), what, setting=setting, split=split)
        if n == len(self):
            return self
        return TensorImageDataset(self.images[:n], self.labels[:n], self.classes)
