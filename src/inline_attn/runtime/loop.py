"""The pieces of a training loop every task shares.

- :func:`backward` and :func:`optimizer_step`: one update with amp's GradScaler and
  gradient-norm clipping (every task's step);
- :class:`StopFlag`: SIGINT / SIGTERM ask the loop to checkpoint at the next step boundary
  (the command then exits with 128 + signum); :func:`stop_everywhere` makes every process stop
  at the same step;
- :class:`OutputLock`: one run per output folder (a second run writing the same ``--output``
  is refused with the holder's process id instead of interleaving checkpoints);
- :class:`LogWindow`, :class:`Cadence` and :class:`EpochCadence`: the loss sums between metric
  rows and when a run logs, evaluates and checkpoints (in iterations or in epochs).
"""

from __future__ import annotations

import pathlib
import signal
import time
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from .._io import FileLock, LockHeld
from .distributed import DistInfo, all_reduce

LOCK_NAME = ".lock"


def backward(loss: torch.Tensor, scaler: Optional[torch.amp.GradScaler]) -> None:
    """``loss.backward()``, scaled under fp16."""
    (scaler.scale(loss) if scaler is not None else loss).backward()


def optimizer_step(
    params: Iterable[nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scaler: Optional[torch.amp.GradScaler],
    clip_grad: Optional[float],
) -> None:
    """Apply the accumulated gradients: unscale (fp16), clip their total norm to ``clip_grad``
    (None or 0: off), step the optimizer (the scaler skips a step with non-finite gradients)."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    if clip_grad:
        nn.utils.clip_grad_norm_([p for p in params if p.requires_grad], float(clip_grad))
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()


def check_finite(loss: torch.Tensor, where: str) -> None:
    """A non-finite loss stops the run, naming where (``iteration 12``)."""
    if not torch.isfinite(loss):
        raise FloatingPointError(f"loss is {loss.item()} at {where}")


class StopFlag:
    """Set by SIGINT/SIGTERM: the loop saves a checkpoint at the next step boundary and returns.

    Use as a context manager (or :meth:`install` / :meth:`restore`); outside the main thread no
    handler is installed. A second Ctrl-C stops at once (KeyboardInterrupt).
    """

    def __init__(self):
        self.signum: Optional[int] = None
        self._old = {}

    def install(self) -> None:
        if not hasattr(signal, "SIGTERM"):
            return
        try:
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        except ValueError:  # not the main thread: no handlers
            self._old = {}

    def _handle(self, signum, frame):
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.signum = signum

    def requested(self) -> bool:
        return self.signum is not None

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}

    def __enter__(self) -> "StopFlag":
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def stop_everywhere(requested: bool, info: DistInfo) -> bool:
    """True on every process when any asks to stop (torchrun signals each worker separately)."""
    flag = torch.tensor([1.0 if requested else 0.0])
    return all_reduce(flag, info, dist.ReduceOp.MAX).item() > 0


def exit_code(signum: Optional[int]) -> int:
    """The shell's code for a run stopped by signal ``signum`` (128 + signum), 0 otherwise."""
    return 128 + int(signum) if signum else 0


class OutputLock:
    """An exclusive lock on ``folder/.lock`` for the life of a run (rank 0 only).

    Two runs writing one output folder would interleave their checkpoints and metrics; the
    second is refused with a ValueError naming the folder and the process holding it. The lock
    is a :class:`~inline_attn._io.FileLock`: the kernel drops it when the holder dies, so a
    killed run never leaves a stale lock behind.
    """

    def __init__(self, folder: pathlib.Path, enabled: bool = True):
        self.folder, self.enabled = pathlib.Path(folder), enabled
        self._lock: Optional[FileLock] = None

    def __enter__(self) -> "OutputLock":
        if not self.enabled:
            return self
        lock = FileLock(self.folder / LOCK_NAME)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            lock.__enter__()
        except LockHeld as e:
            raise ValueError(
                f"output folder {self.folder} is in use by another run (process {e.holder}, lock {e.path}): "
                "wait for it to finish, stop it, or choose another --output"
            ) from None
        except OSError as e:  # a read-only place, or a file where a folder should be
            raise ValueError(
                f"cannot write the run's outputs into {self.folder} ({type(e).__name__}: {e.strerror or e}): "
                "choose a writable --output folder"
            ) from None
        self._lock = lock
        return self

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            self._lock.__exit__(*exc)
            self._lock = None


@dataclass
class LogWindow:
    """Loss sums of this process since the last metrics row: ``add`` after every step, ``row``
    reduces them over the processes into per-step means and the images per second."""

    keys: Sequence[str]
    sums: torch.Tensor = field(init=False)
    started: float = field(init=False, default_factory=time.time)
    steps: int = 0

    def __post_init__(self):
        self.sums = torch.zeros(len(self.keys) + 1, dtype=torch.float64)  # the losses, images

    def add(self, losses: dict, images: int) -> None:
        zero = torch.zeros(())
        values = [losses.get(k, zero).item() for k in self.keys] + [images]
        self.sums += torch.tensor(values, dtype=torch.float64)
        self.steps += 1

    def row(self, info: DistInfo, present: Iterable[str]) -> dict:
        """``{key: mean per step}`` (None for a key not in ``present``) and ``img_s``; resets."""
        sums = all_reduce(self.sums.clone(), info)
        n, present = max(1, self.steps), set(present)
        out = {k: sums[i].item() / n / info.world_size if k in present else None for i, k in enumerate(self.keys)}
        out["img_s"] = round(sums[-1].item() / max(time.time() - self.started, 1e-9), 2)
        self.sums.zero_()
        self.steps, self.started = 0, time.time()
        return out


@dataclass(frozen=True)
class Cadence:
    """When an iteration-based run logs, evaluates and checkpoints (intervals in iterations;
    ``eval_every`` 0: only at the end; ``max_steps`` 0: no early stop)."""

    iters: int
    log_every: int
    eval_every: int
    ckpt_every: int
    max_steps: int = 0

    def final(self, step: int) -> bool:
        return step == self.iters or bool(self.max_steps and step >= self.max_steps)

    def evaluate(self, step: int) -> bool:
        return bool(self.eval_every and step % self.eval_every == 0) or step == self.iters

    def log(self, step: int) -> bool:
        return step % self.log_every == 0 or self.final(step) or bool(self.eval_every and step % self.eval_every == 0)

    def checkpoint(self, step: int) -> bool:
        return step % self.ckpt_every == 0 or self.final(step)

    def stop_early(self, step: int) -> bool:
        return bool(self.max_steps and step >= self.max_steps and step < self.iters)


class EpochCadence(Cadence):
    """An epoch-based run's cadence (``log_every``: the steps of an epoch): a metrics row and a
    checkpoint at the end of every epoch; ``max_steps`` (0: none) stops at that step, mid-epoch
    or at the end, with a checkpoint."""

    def log(self, step: int) -> bool:
        return step % self.log_every == 0

    def stop_early(self, step: int) -> bool:
        return bool(self.max_steps and step >= self.max_steps)
