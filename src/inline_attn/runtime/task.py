"""What a task supplies to a run (:class:`Task`), when the run logs, evaluates and checkpoints
(:class:`Cadence`: every so many iterations; :class:`EpochCadence`: at the end of every epoch) and
the micro-batches of one optimizer step (:class:`MicroBatches`). The run that drives them is
:class:`~inline_attn.runtime.run.Run`.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Optional

import torch
import torch.nn as nn

from .distributed import DistInfo

if TYPE_CHECKING:
    from .run import Run

__all__ = ["Cadence", "EpochCadence", "MicroBatches", "Task"]


@dataclass(frozen=True)
class Cadence:
    """When an iteration-based run logs, evaluates and checkpoints (intervals in iterations;
    ``eval_every`` 0: only at the end; ``max_steps`` 0: no early stop); ``accum``: the
    micro-batches of one optimizer step (what :meth:`Task.batches` yields as one
    :class:`MicroBatches`)."""

    iters: int
    log_every: int
    eval_every: int
    ckpt_every: int
    max_steps: int = 0
    accum: int = 1

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

    def row(self, step: int, lr_at) -> dict:
        """A metrics row's place: the step and the lr of its last step."""
        return {"step": step, "lr": lr_at(step - 1)}

    def line(self, step: int, evaluated: bool) -> Optional[str]:
        """The head of the row's printed line (None: no line without an evaluation)."""
        return f"iteration {step}/{self.iters}" if evaluated else None


class EpochCadence(Cadence):
    """An epoch-based run's cadence (``log_every``: the steps of an epoch): a metrics row and a
    checkpoint at the end of every epoch; ``max_steps`` (0: none) stops at that step, mid-epoch
    or at the end, with a checkpoint."""

    def log(self, step: int) -> bool:
        return step % self.log_every == 0

    def stop_early(self, step: int) -> bool:
        return bool(self.max_steps and step >= self.max_steps)

    def row(self, step: int, lr_at) -> dict:
        """The epoch (from 0), the step and the lr the next epoch starts at (the authors' log)."""
        return {"epoch": step // self.log_every - 1, "step": step, "lr": lr_at(step)}

    def line(self, step: int, evaluated: bool) -> str:
        return f"epoch {step // self.log_every}/{self.iters // self.log_every}"


class MicroBatches:
    """The ``n`` micro-batches of one optimizer step, each taken (``take()``) when the run
    reaches it, so its augmentation runs right before its forward pass as without
    accumulation."""

    def __init__(self, n: int, take: Callable[[], object]):
        self.n, self.take = n, take

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return (self.take() for _ in range(self.n))


class Task:
    """What a task trains; :class:`Run` says how, for every task.

    The run owns the step counter, the history, the elapsed time, the one checkpoint format and
    its reader, resume, seeding, DDP, the optimizer step with gradient accumulation and clipping,
    the EMA, CUDA graphs, channels-last and torch.compile (``RunCfg``'s settings), the metrics
    rows and ``metrics.csv``, TensorBoard, best checkpoints (:attr:`best_key`), the summary and
    the stop message. Every task implements every hook that
    raises ``NotImplementedError``; the attributes say how its rows and checkpoints are named.
    """

    kind: str  # "segmentation" | "detection" | "classification" (messages)
    config: type  # the typed config class
    csv_columns: list  # metrics.csv
    loss_keys: tuple = ("loss",)  # the losses of a row; the first is the one minimised
    metric_keys: tuple = ()  # the evaluation numbers in a metrics row
    metric_digits: Optional[int] = None  # rounding of those numbers in the row (None: as measured)
    throughput_key: str = "img_s"  # the row's images per second
    window_key: Optional[str] = None  # the row's seconds since the last row (None: not in the row)
    best_key: Optional[str] = None  # best.pth (and best_ema.pth) follow the highest value of this metric
    # loss(model(x), batch[1]) with x = input_norm(batch[0]), or a dict of the loss_keys' terms: a CUDA-graphed step
    criterion: Optional[Callable] = None
    # the module a graphed step calls in place of the model, made from it (its parameters, not a copy):
    # its output is what ``criterion`` takes (None: the model; a task with an EMA keeps None)
    criterion_forward: Optional[Callable[[nn.Module], nn.Module]] = None
    not_graphed: str = "its losses are computed inside the model"  # why a task without a criterion runs ungraphed
    picture_each_row: bool = False  # the picture redrawn at every row's checkpoint, not only at the end
    distributed: bool = True  # whether the task trains on several processes
    sync_bn: bool = False  # BatchNorm synchronised over the processes on GPUs (mmseg's SyncBN)
    checkpoint_keys: tuple = ()  # what a checkpoint of the task holds besides the run's RUN_KEYS

    def datasets(self, cfg, info: DistInfo, progress: bool):
        """(train set, val set); the train set has ``classes`` and ``num_classes``."""
        raise NotImplementedError

    def build_model(self, cfg, num_classes: int) -> nn.Module:
        raise NotImplementedError

    def optimization(self, cfg, model: nn.Module) -> tuple:
        """(optimizer, schedule, EMA decay per step or None): the schedule steps once per step and
        tells ``lr_at(step)``."""
        raise NotImplementedError

    def cadence(self, cfg) -> Cadence:
        """When the run logs, evaluates, checkpoints and stops, and the micro-batches of a step."""
        raise NotImplementedError

    def batches(self, train_set, cfg, info: DistInfo, step: int) -> Iterator:
        """One item a step from step ``step`` on: a batch for :meth:`losses`, or a
        :class:`MicroBatches` of ``cadence.accum`` of them."""
        raise NotImplementedError

    def losses(self, model: nn.Module, batch, norm: nn.Module, device: torch.device, amp: str) -> tuple[dict, int]:
        """({loss key: loss}, the first of :attr:`loss_keys` the one to minimise; images in the batch)."""
        raise NotImplementedError

    def evaluate(self, model, val_set, cfg, device, info: DistInfo, amp: str, progress: bool, forward=None) -> dict:
        """The evaluation numbers (:attr:`metric_keys` among them); ``forward``: the run's captured
        evaluation forward of ``model`` (CUDA graphs), or None."""
        raise NotImplementedError

    def eval_line(self, row: dict) -> str:
        """A metrics row as printed after its cadence's head."""
        raise NotImplementedError

    def summary(self, cfg, model: nn.Module, history: list, last_eval: Optional[dict], classes: list) -> dict:
        """The task's entries of the run summary."""
        raise NotImplementedError

    def picture(self, model, val_set, cfg, device, out: pathlib.Path, step: int, history: list, last_eval):
        """(summary key, path) of the run's picture written into ``out``: validation predictions, or
        the curves of ``history``."""
        raise NotImplementedError

    def extra_state(self, run: "Run") -> dict:
        """The task's entries of a checkpoint (beside the run's)."""
        raise NotImplementedError

    def load_extra_state(self, run: "Run", where: str, state: dict) -> None:
        """Check that checkpoint ``state`` (read from ``where``) fits this run's data; a
        ValueError saying what differs and how to proceed otherwise."""
        raise NotImplementedError

    def input_norm(self, cfg) -> nn.Module:
        """What :meth:`losses` applies to the images (moved to the device by the run)."""
        return nn.Identity()

    def headline(self, cfg) -> dict:
        """The summary's first entries: what was trained."""
        return {}
