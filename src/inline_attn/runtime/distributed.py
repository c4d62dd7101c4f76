"""torch.distributed helpers: one process or many (torchrun, or an explicit init in tests)."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.distributed as dist

# rank r seeds its augmentation (and dropout) with seed + r * SEED_STRIDE (a large prime: no two
# ranks of any run, nor two seeds a user is likely to try, share a stream)
SEED_STRIDE = 1000003


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    initialized_here: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def resolve_device(name: str, *, what: str = "train.device") -> torch.device:
    """``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``; ``what`` names the setting in errors."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", str(name)):
        raise ValueError(f"{what}={name!r}: expected auto, cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"{what}={name!r} but CUDA is not available")
    return torch.device(name)


def init_distributed(
    device: str = "auto",
    *,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    init_method: Optional[str] = None,
) -> DistInfo:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1) or when ``rank``,
    ``world_size`` and ``init_method`` are given; gloo on CPU, nccl on CUDA."""
    dev = resolve_device(device)
    if dist.is_available() and dist.is_initialized():
        r, w = dist.get_rank(), dist.get_world_size()
        lr = int(os.environ.get("LOCAL_RANK", r))
        return DistInfo(r, w, lr, _local_device(dev, lr), False)
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo(0, 1, 0, dev, False)
    if rank is None:
        rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    dev = _local_device(dev, local_rank)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, init_method=init_method or "env://", rank=rank, world_size=world_size)
    return DistInfo(rank, world_size, local_rank, dev, True)


def _local_device(dev: torch.device, local_rank: int) -> torch.device:
    return torch.device("cuda", local_rank) if dev.type == "cuda" else dev


def all_reduce(t: torch.Tensor, info: DistInfo, op=None) -> torch.Tensor:
    """Reduce a (CPU) tensor over ranks in place (sum by default); identity on one process.

    NCCL reduces only CUDA tensors: the values travel through the rank's device and back.
    """
    if info.enabled:
        op = dist.ReduceOp.SUM if op is None else op
        if info.device.type == "cuda":
            d = t.to(info.device)
            dist.all_reduce(d, op=op)
            t.copy_(d.cpu())
        else:
            dist.all_reduce(t, op=op)
    return t


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum over ranks (in place; identity on one process)."""
    return all_reduce(t, info)


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def cleanup(info: DistInfo) -> None:
    if info.initialized_here and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def run_session(
    device: str,
    threads: int = 0,
    *,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    init_method: Optional[str] = None,
) -> Iterator[DistInfo]:
    """A training run's process set-up: ``threads`` torch threads (0: as is), the process group
    (:func:`init_distributed`); on exit the group is left and the thread count and the
    process-global deterministic mode are put back (tests run many trainings in one process)."""
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    det = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    info = None
    try:
        info = init_distributed(device, rank=rank, world_size=world_size, init_method=init_method)
        yield info
    finally:
        torch.use_deterministic_algorithms(det[0], warn_only=det[1])
        torch.set_num_threads(old_threads)
        if info is not None:
            cleanup(info)
