"""Datasets and batch iteration for the engine (sharded by rank, resumable mid-epoch)."""
from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch.utils.data import DataLoader, DistributedSampler

from ..data import FMNIST_MEAN, FMNIST_STD, ImageFolder, TensorImageDataset, load_fashion_mnist


@dataclass
class DataInfo:
    num_classes: int
    in_chans: int
    img_size: int
    mean: tuple
    std: tuple
    crop_pct: float
    interpolation: str


def resolve_data_info(cfg: dict, model_cfg) -> DataInfo:
    """Input size, normalisation and crop settings: the config's, else the dataset's, else the model's."""
    d = cfg["data"]
    fmnist = d["dataset"] == "fmnist"
    img_size = d["img_size"] or (28 if fmnist else model_cfg.input_size[-1])
    mean = tuple(d["mean"] or (FMNIST_MEAN if fmnist else model_cfg.mean))
    std = tuple(d["std"] or (FMNIST_STD if fmnist else model_cfg.std))
    crop_pct = d["crop_pct"] or (1.0 if fmnist else model_cfg.crop_pct)
    interpolation = d["interpolation"] or model_cfg.interpolation
    return DataInfo(0, len(mean), int(img_size), mean, std, float(crop_pct), interpolation)


def folder_split(path, split: str) -> pathlib.Path:
    """``path/split`` when it exists, else ``path`` itself when it holds class folders directly."""
    if path is None:
        raise ValueError("data.path is required for dataset 'folder' (an ImageNet-layout folder)")
    root = pathlib.Path(path)
    if not root.is_dir():
        raise ValueError(f"data folder {root} does not exist")
    return root / split if (root / split).is_dir() else root


def build_datasets(cfg: dict, info: DataInfo, *, train: bool = True):
    """(train_set or None, val_set); sets ``info.num_classes``."""
    d = cfg["data"]
    if d["dataset"] == "fmnist":
        tr = load_fashion_mnist(d["path"], "train").subset(d["subset"]) if train else None
        va = load_fashion_mnist(d["path"], "test").subset(d["val_subset"])
        info.num_classes = 10
        return tr, va
    if d["dataset"] != "folder":
        raise ValueError(f"data.dataset={d['dataset']!r}: expected 'folder' or 'fmnist'")
    kw = dict(img_size=info.img_size, crop_pct=info.crop_pct, interpolation=info.interpolation)
    tr = ImageFolder(folder_split(d["path"], d["train_split"]), train=True, **kw) if train else None
    va = ImageFolder(folder_split(d["path"], d["val_split"]), train=False, **kw)
    if tr is not None and tr.classes != va.classes:
        raise ValueError(f"train classes ({len(tr.classes)}) and val classes ({len(va.classes)}) differ")
    for ds, n in ((tr, d["subset"]), (va, d["val_subset"])):
        if ds is not None and n > 0:
            ds.samples = ds.samples[:n]
    info.num_classes = len(va.classes)
    return tr, va


class Batches:
    """Iterates ``(images uint8 [b,C,H,W], labels [b])`` for one rank.

    Training: a DistributedSampler permutation (seed + epoch; the same on every rank, each rank
    takes its stride) cut into full batches; ``skip`` batches are left out when resuming
    mid-epoch. Evaluation: rank r takes samples r, r + W, ... in order, no padding, so summed
    metrics are exact. ``pin_memory``: page-locked batches (for a CUDA device: the copy overlaps).
    """

    def __init__(self, dataset, batch_size: int, *, rank: int = 0, world_size: int = 1, train: bool,
                 seed: int = 0, workers: int = 0, pin_memory: bool = False):
        self.dataset = dataset
        self.pin_memory = pin_memory
        self.batch_size = batch_size
        self.rank, self.world_size = rank, world_size
        self.train = train
        self.seed = seed
        self.workers = workers
        if train:
            self.sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                              seed=seed, drop_last=True)
            if len(self.sampler) < batch_size:
                raise ValueError(f"{len(dataset)} training images are fewer than one global batch "
                                 f"({batch_size} x {world_size} processes)")

    def __len__(self) -> int:
        if self.train:
            return len(self.sampler) // self.batch_size
        n = len(range(self.rank, len(self.dataset), self.world_size))
        return (n + self.batch_size - 1) // self.batch_size

    def index_batches(self, epoch: int = 0, skip: int = 0) -> list[list[int]]:
        if self.train:
            self.sampler.set_epoch(epoch)
            idx = list(iter(self.sampler))
            nb = len(idx) // self.batch_size
            return [idx[i * self.batch_size:(i + 1) * self.batch_size] for i in range(skip, nb)]
        idx = list(range(self.rank, len(self.dataset), self.world_size))
        return [idx[i:i + self.batch_size] for i in range(0, len(idx), self.batch_size)]

    def iterate(self, epoch: int = 0, skip: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = self.index_batches(epoch, skip)
        if isinstance(self.dataset, TensorImageDataset):
            for b in batches:
                x, y = self.dataset.batch(torch.tensor(b))
                # page-locked batches let the copy to a CUDA device overlap the previous step
                yield (x.pin_memory(), y.pin_memory()) if self.pin_memory else (x, y)
            return
        # a private generator: creating the loader must not consume the global RNG (exact resume)
        gen = torch.Generator().manual_seed(self.seed + epoch)
        loader = DataLoader(self.dataset, batch_sampler=batches, num_workers=self.workers, generator=gen,
                            persistent_workers=False, pin_memory=self.pin_memory)
        for x, y in loader:
            yield x, torch.as_tensor(y)


def open_eval_source(data: str, img_size: int, crop_pct: float, interpolation: str, split: Optional[str] = None):
    """``data`` = "fmnist" (or "fmnist:DIR") or an ImageNet-layout folder -> (dataset, is_fmnist)."""
    if data == "fmnist" or data.startswith("fmnist:"):
        root = data.split(":", 1)[1] if ":" in data else None
        return load_fashion_mnist(root, split or "test"), True
    root = folder_split(data, split or "val")
    return ImageFolder(root, img_size, train=False, crop_pct=crop_pct, interpolation=interpolation), False


def tensor_source(x: torch.Tensor, y: torch.Tensor) -> TensorImageDataset:
    return TensorImageDataset(x, y)
