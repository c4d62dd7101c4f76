"""Datasets and batch iteration for classification training (sharded by rank, resumable mid-epoch)."""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler

from typing import Optional

from ..data import RRC, DataInfo, ImageFolder, TensorImageDataset, folder_split, load_fashion_mnist, resolve_data_info
from ..data.subset import subset_size
from .config import AugCfg, DataCfg


def data_info(data: DataCfg, model_cfg) -> DataInfo:
    """The config's input settings, else the dataset's, else the model's (class count not yet known)."""
    return resolve_data_info(
        model_cfg,
        fmnist=data.dataset == "fmnist",
        img_size=data.img_size,
        mean=data.mean,
        std=data.std,
        crop_pct=data.crop_pct,
        interpolation=data.interpolation,
        eval_resize=data.eval_resize,
    )


def loader_crops(data: DataCfg, aug: Optional[AugCfg]) -> bool:
    """Whether the data loader does the random resized crop (image folders: on the whole decoded
    image, with Pillow), leaving the device augmentation none to do."""
    return aug is not None and aug.crop == "rrc" and data.dataset == "folder"


def build_datasets(data: DataCfg, info: DataInfo, *, train: bool = True, aug: Optional[AugCfg] = None, seed: int = 0):
    """``(train_set or None, val_set, info with the class count)``; ``aug`` and ``seed`` set an
    image folder's training crop (:func:`loader_crops`). A folder of fewer than 2 classes is
    refused (a classifier of one class learns nothing: its loss is 0 from the first step), and so
    is a ``data.subset`` / ``data.val_subset`` larger than its set
    (:func:`~inline_attn.data.subset.subset_size`)."""
    if data.dataset == "fmnist":
        tr = load_fashion_mnist(data.path, "train") if train else None
        va = load_fashion_mnist(data.path, "test")
        if tr is not None:
            tr = tr.subset(data.subset, "Fashion-MNIST's training split", setting="data.subset", split="training")
        va = va.subset(data.val_subset, "Fashion-MNIST's test split", setting="data.val_subset", split="validation")
        return tr, va, info.with_classes(len(va.classes))
    kw = dict(img_size=info.img_size, crop_pct=info.crop_pct, interpolation=info.interpolation)
    rrc = RRC(tuple(aug.scale), tuple(aug.ratio)) if loader_crops(data, aug) else None
    tr = ImageFolder(folder_split(data.path, data.train_split), train=True, rrc=rrc, seed=seed, **kw) if train else None
    va = ImageFolder(
        folder_split(data.path, data.val_split, what="data.path / data.val_split"),
        train=False,
        eval_resize=info.eval_resize,
        **kw,
    )
    if tr is not None and tr.classes != va.classes:
        raise ValueError(f"train classes ({len(tr.classes)}) and val classes ({len(va.classes)}) differ")
    if len(va.classes) < 2:
        raise ValueError(
            f"data folder {va.root} holds one class ({va.classes[0]!r}): classification needs at least 2 class folders"
        )
    for ds, n, setting, split in (
        (tr, data.subset, "data.subset", "training"),
        (va, data.val_subset, "data.val_subset", "validation"),
    ):
        if ds is not None:
            ds.samples = ds.samples[: subset_size(n, len(ds), f"data folder {ds.root}", setting=setting, split=split)]
    return tr, va, info.with_classes(len(va.classes))


def _collate_readable(items):
    """Stack the readable samples of a batch; count the ones that came back as ``None``."""
    good = [(x, y) for x, y in items if x is not None]
    if not good:
        return None, None, len(items)
    x = torch.stack([x for x, _ in good])
    y = torch.as_tensor([int(y) for _, y in good])
    return x, y, len(items) - len(good)


class Batches:
    """Iterates ``(images uint8 [b,C,H,W], labels [b])`` for one rank.

    Training: a DistributedSampler permutation (seed + epoch; the same on every rank, each rank
    takes its stride) cut into full batches; ``skip`` batches are left out when resuming
    mid-epoch. Evaluation: rank r takes samples r, r + W, ... in order, no padding, so summed
    metrics are exact. Images the dataset could not read are left out of their batch and
    counted in :attr:`unreadable` (per :meth:`iterate` pass). ``pin_memory``: page-locked batches
    (for a CUDA device: the copy overlaps).
    """

    def __init__(
        self,
        dataset,
        batch_size: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        train: bool,
        seed: int = 0,
        workers: int = 0,
        pin_memory: bool = False,
    ):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch size must be a positive integer, got {batch_size!r}")
        self.dataset = dataset
        self.pin_memory = pin_memory
        self.batch_size = batch_size
        self.rank, self.world_size = rank, world_size
        self.train = train
        self.seed = seed
        self.workers = workers
        self.unreadable = 0
        if train:
            self.sampler = DistributedSampler(
                dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
            )
            if len(self.sampler) < batch_size:
                raise ValueError(
                    f"{len(dataset)} training images are fewer than one global batch "
                    f"({batch_size} x {world_size} processes)"
                )

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
            return [idx[i * self.batch_size : (i + 1) * self.batch_size] for i in range(skip, nb)]
        idx = list(range(self.rank, len(self.dataset), self.world_size))
        return [idx[i : i + self.batch_size] for i in range(0, len(idx), self.batch_size)]

    def iterate(self, epoch: int = 0, skip: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.unreadable = 0
        if self.train and hasattr(self.dataset, "set_epoch"):  # per-sample random crops follow the epoch
            self.dataset.set_epoch(epoch)
        batches = self.index_batches(epoch, skip)
        if isinstance(self.dataset, TensorImageDataset):
            on_host = self.dataset.images.device.type == "cpu"
            for b in batches:
                x, y = self.dataset.batch(torch.tensor(b, device=self.dataset.images.device))
                # page-locked batches let the copy to a CUDA device overlap the previous step
                yield (x.pin_memory(), y.pin_memory()) if self.pin_memory and on_host else (x, y)
            return
        # a private generator: creating the loader must not consume the global RNG (exact resume)
        gen = torch.Generator().manual_seed(self.seed + epoch)
        loader = DataLoader(
            self.dataset,
            batch_sampler=batches,
            num_workers=self.workers,
            generator=gen,
            persistent_workers=False,
            collate_fn=_collate_readable,
            pin_memory=self.pin_memory,
        )
        for x, y, bad in loader:
            self.unreadable += bad
            if x is not None:
                yield x, y
