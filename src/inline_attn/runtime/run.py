"""One training run for every task: set-up, resume, the steps, checkpoints, signals and the
closing summary; each task supplies its hooks (:class:`Task`).

``train(task, cfg)`` writes, from rank 0, into ``train.output``: ``config.yaml``, ``last.pth``
(atomically, at the task's checkpoint cadence, at the end and on SIGINT / SIGTERM; the one it
replaces kept as ``previous.pth``), ``metrics.csv``, ``summary.json`` and the task's own files (a
picture of validation predictions; classification's best checkpoints and curves). The task's
cadence says when a metrics row and a checkpoint are due: every so many iterations
(:class:`Cadence`) or at the end of every epoch (:class:`EpochCadence`). Every checkpoint has one
format (:meth:`Run.checkpoint`: the run's entries, each process's RNG in ``rank_states``, the
task's entries beside them), read back by one reader
(:func:`~inline_attn.runtime.checkpoint.read_run_checkpoint`). The output folder is claimed first
(:func:`~inline_attn.runtime.output.claim_output`): a second run is refused while the first holds
it, and a new run into a folder holding a finished or interrupted one unless ``train.overwrite``.
``train.resume`` continues a run when its training-shaping settings (every setting not declared
``resume=True``), number of processes and weights fit (a ValueError naming what differs otherwise).

The summary says how a run ended: ``stopped`` is None (finished), ``"max_steps"`` or ``"signal"``
(``signal``: its number); :func:`~inline_attn.runtime.signals.exit_code` turns that into the
command's exit status.
"""

from __future__ import annotations

import logging
import os
import pathlib
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from .amp import grad_scaler, resolve_amp
from .checkpoint import (
    LAST,
    RUN_KEYS,
    check_resume,
    load_module,
    load_optimizer,
    load_resume,
    rank_states,
    read_run_checkpoint,
    rng_state,
    save_rotating,
    set_rng_state,
)
from .config import TypedConfig
from .distributed import SEED_STRIDE, DistInfo, all_reduce, barrier, run_session
from .finite import check_finite
from .ema import ModelEma
from .optim import backward, optimizer_step, plain_state_dict
from .signals import StopFlag, stop_everywhere
from .output import claim_output
from .progress import progress_bar, restart_clock
from .report import nan_to_none, write_csv, write_json

log = logging.getLogger(__name__)

__all__ = ["Cadence", "EpochCadence", "LogWindow", "Run", "Task", "seed_everything", "train"]


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


class Task:
    """What a task does its own way; :class:`Run` does the rest.

    The run owns the step counter, the history, the elapsed time, the one checkpoint format and
    its reader, resume, seeding, the EMA and the stop message. The hooks under "what" say what
    the task trains; those below them have defaults for an iteration-based task with one model,
    its optimizer and schedule (segmentation, detection), which a task with another cadence
    (classification's epochs, accumulation, CUDA graphs and best checkpoints) overrides.
    """

    kind: str  # "segmentation" | "detection" | "classification" (messages)
    config: type  # the typed config class
    csv_columns: list  # metrics.csv
    loss_keys: tuple = ("loss",)  # the losses logged ("loss" first)
    metric_keys: tuple = ()  # the evaluation numbers in a metrics row
    distributed: bool = True  # whether the task trains on several processes
    checkpoint_keys: tuple = ()  # what a checkpoint of the task holds besides the run's RUN_KEYS

    # what the task trains

    def datasets(self, cfg, progress: bool):
        """(train set, val set); the train set has ``classes`` and ``num_classes``."""
        raise NotImplementedError

    def build_model(self, cfg, num_classes: int) -> nn.Module:
        raise NotImplementedError

    def optimization(self, cfg, model: nn.Module) -> tuple:
        """(optimizer, schedule): the schedule steps once per step and tells ``lr_at(step)``."""
        raise NotImplementedError

    def cadence(self, cfg) -> Cadence:
        """When the run logs, evaluates, checkpoints and stops."""
        raise NotImplementedError

    def batches(self, train_set, cfg, info: DistInfo, step: int) -> Iterator:
        """What :meth:`step` takes, one item a step, from step ``step`` on."""
        raise NotImplementedError

    def losses(self, model: nn.Module, batch, norm: nn.Module, device: torch.device, amp: str) -> tuple[dict, int]:
        """(losses with "loss" the one to minimise, images in the batch)."""
        raise NotImplementedError

    def evaluate(self, model, val_set, cfg, device, info: DistInfo, amp: str, progress: bool) -> dict:
        raise NotImplementedError

    def eval_line(self, row: dict) -> str:
        raise NotImplementedError

    def summary(self, cfg, history: list, last_eval: Optional[dict], classes: list) -> dict:
        """The task's entries of the run summary."""
        raise NotImplementedError

    def picture(self, model, val_set, cfg, device, out: pathlib.Path, step: int, history: list, last_eval):
        """(summary key, path) of the run's picture written into ``out``: validation predictions, or
        the curves of ``history``."""
        raise NotImplementedError

    # how, with defaults for an iteration-based task

    def input_norm(self, cfg) -> nn.Module:
        """What :meth:`losses` applies to the images (moved to the device by the run)."""
        return nn.Identity()

    def headline(self, cfg) -> dict:
        """The summary's first entries: what was trained."""
        return {}

    def ema_decay(self, cfg) -> Optional[float]:
        """The decay per step of the run's EMA of the weights (None: no EMA)."""
        return None

    def check(self, cfg, info: DistInfo) -> None:
        """Refuse a config these processes cannot run, before the output folder is touched."""

    def wrap(self, run: "Run") -> nn.Module:
        """The model to call: DDP over several processes, the heads' BatchNorm synchronised on GPUs
        (mmseg's SyncBN)."""
        if not run.info.enabled:
            return run.model
        if run.device.type == "cuda":
            run.model = nn.SyncBatchNorm.convert_sync_batchnorm(run.model)
        ids = [run.device.index] if run.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(run.model, device_ids=ids)

    def step(self, run: "Run", model: nn.Module, batch) -> tuple[dict, int]:
        """One optimizer step of ``model`` (what ``run`` calls) on ``batch``: (losses, images)."""
        run.optimizer.zero_grad(set_to_none=True)
        losses, images = self.losses(model, batch, run.norm, run.device, run.amp)
        check_finite(losses["loss"], f"iteration {run.step}")
        backward(losses["loss"], run.scaler)
        optimizer_step(run.model.parameters(), run.optimizer, run.scaler, run.cfg.optim.clip_grad)
        run.sched.step()
        if run.ema is not None:
            run.ema.update(run.model)
        return losses, images

    def record(self, run: "Run", window: LogWindow, losses: dict, pbar) -> None:
        """A metrics row (evaluating when due), appended to the history and ``metrics.csv``."""
        row = window.row(run.info, losses)
        row.update(step=run.step, lr=run.sched.lr_at(run.step - 1))
        row["elapsed_s"] = round(run.elapsed + time.time() - run.t_start, 1)
        if run.cadence.evaluate(run.step):
            args = (run.cfg, run.device, run.info, run.amp, run.show)
            run.last_eval = self.evaluate(run.model, run.val_set, *args)
            row.update({k: round(run.last_eval[k], 2) for k in self.metric_keys})
            if run.info.is_main:
                pbar.write(f"iteration {run.step}/{run.cadence.iters}  {self.eval_line(row)}")
            run.model.train()
        run.history.append(row)
        if run.info.is_main:
            write_csv(run.history, run.out / "metrics.csv", self.csv_columns)

    def rank_state(self, run: "Run") -> dict:
        """What this process adds to its entry of the checkpoint's ``rank_states`` (beside its RNG)."""
        return {}

    def extra_state(self, run: "Run") -> dict:
        """The task's entries of a checkpoint (beside the run's)."""
        return {}

    def load_extra_state(self, run: "Run", where: str, state: dict, rank: Optional[dict]) -> None:
        """Continue from checkpoint ``state`` (read from ``where``): the task's entries, and this
        process's entry of ``rank_states`` (None when saved by another number of processes)."""

    def saved(self, run: "Run", path: pathlib.Path) -> None:
        """After rank 0 wrote a checkpoint to ``path``."""

    def finish(self, run: "Run", stopped: Optional[str], signum: Optional[int]) -> dict:
        """The summary of the run (written by rank 0)."""
        summary = {
            **self.headline(run.cfg),
            "params": run.n_params,
            "iterations": run.step,
            "world_size": run.info.world_size,
            "device": str(run.device),
            "stopped": stopped,
            "signal": signum if stopped == "signal" else None,
            "train_time_s": round(run.elapsed + time.time() - run.t_start, 1),
            "checkpoint": str(run.out / LAST),
            "output": str(run.out),
            "classes": list(run.train_set.classes),
        }
        summary.update(self.summary(run.cfg, run.history, run.last_eval, list(run.train_set.classes)))
        if run.info.is_main:
            if stopped is None and run.cfg.train.predictions_png:
                run.add_picture(summary)
            write_json(nan_to_none(summary), run.out / "summary.json")
        return summary

    def close(self, run: "Run") -> None:
        """When the run ends, however it ends."""


def train(
    task: Task,
    cfg: TypedConfig,
    *,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    init_method: Optional[str] = None,
) -> dict:
    """Train ``task`` with ``cfg``; returns the summary (``stopped``: None, "max_steps" or
    "signal" with ``signal`` its number). ``rank`` / ``world_size`` / ``init_method`` join a
    process group explicitly (tests); under torchrun they come from the environment."""
    if not isinstance(cfg, task.config):
        raise ValueError(f"{task.kind} training takes a {task.config.__name__}, got {type(cfg).__name__}")
    t = cfg.train
    with run_session(t.device, t.threads, rank=rank, world_size=world_size, init_method=init_method) as info:
        if info.enabled and not task.distributed:
            raise ValueError(f"{task.kind} training runs in one process (got world size {info.world_size})")
        task.check(cfg, info)
        with claim_output(t.output, resume=t.resume, overwrite=t.overwrite, lock=info.is_main):
            return Run(task, cfg, info).train()


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's generators from ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Run:
    """One training run: set-up, resume, the steps, checkpoints, signals, the closing summary.

    ``step`` counts optimizer steps, ``history`` holds the metrics rows, ``elapsed`` the training
    time of earlier processes (resumes), ``ema`` the EMA of the weights (or None); the task's
    hooks read them, and only the run writes them (the history: through :meth:`Task.record`).
    """

    def __init__(self, task: Task, cfg: TypedConfig, info: DistInfo):
        self.task, self.cfg, self.info, self.device = task, cfg, info, info.device
        self.out = pathlib.Path(cfg.train.output)
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
            if self.device.type == "cuda":
                torch.backends.cudnn.benchmark = False
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        self.show = info.is_main and cfg.train.progress
        self.amp = resolve_amp(cfg.train.amp, self.device)
        self.scaler = grad_scaler(self.amp)
        self.step, self.history, self.elapsed, self.last_eval = 0, [], 0.0, None
        self.t_start = time.time()
        self.setup()
        self.n_params = sum(p.numel() for p in self.model.parameters())

    def setup(self) -> None:
        """The data, the model (initialised alike on every process: DDP broadcasts it too), its
        optimizer, schedule and EMA, the input normalisation and the cadence, from the task."""
        cfg, task = self.cfg, self.task
        seed_everything(cfg.train.seed)
        self.train_set, self.val_set = task.datasets(cfg, self.show)
        seed_everything(cfg.train.seed)
        self.model = task.build_model(cfg, self.train_set.num_classes).to(self.device)
        self.optimizer, self.sched = task.optimization(cfg, self.model)
        decay = task.ema_decay(cfg)
        self.ema = ModelEma(self.model, decay) if decay is not None else None
        self.norm = task.input_norm(cfg).to(self.device)
        self.cadence = task.cadence(cfg)

    def read(self, path) -> dict:
        """A checkpoint of this task read from ``path`` (the one reader)."""
        return read_run_checkpoint(path, RUN_KEYS + self.task.checkpoint_keys, self.task.kind)

    def resume_or_seed(self) -> None:
        """Continue from ``train.resume`` (checked to fit); else seed this rank (dropout, drop
        path and augmentation differ per rank)."""
        found = load_resume(self.cfg.train.resume, self.out, self.read)
        if found is None:
            seed_everything(self.cfg.train.seed + SEED_STRIDE * self.info.rank)
            return
        self.restore(*found)
        if self.info.is_main:
            log.info("resumed from %s at step %d", found[0], self.step)

    def restore(self, path: pathlib.Path, state: dict) -> None:
        """Continue from checkpoint ``state`` read from ``path``, after checking it fits."""
        where, info = f"checkpoint {str(path)!r}", self.info
        check_resume(where, self.cfg.differences(state.get("config") or {}), state.get("world_size"), info.world_size)
        ranks = rank_states(state)
        rank = ranks[info.rank] if len(ranks) == info.world_size else None
        self.task.load_extra_state(self, where, state, rank)
        load_module(self.model, state["model"], where, "model")
        if self.ema is not None and state.get("model_ema"):
            load_module(self.ema.module, state["model_ema"], where, "model_ema")
        load_optimizer(self.optimizer, state["optimizer"], where)
        self.sched.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.step, self.history = int(state["step"]), list(state.get("history", []))
        self.elapsed = float(state.get("elapsed_s", 0.0))
        if rank is not None:
            set_rng_state(rank["rng"])

    def train(self) -> dict:
        try:
            self.resume_or_seed()
            model = self.task.wrap(self)
            # the handlers go in before config.yaml appears (the sign that a run has started), so a
            # signal from then on always ends in a checkpoint and the 128 + signum exit
            with StopFlag() as stop:
                if self.info.is_main:
                    self.out.mkdir(parents=True, exist_ok=True)
                    self.cfg.save(self.out / "config.yaml")
                self.t_start = time.time()
                stopped = self.iterate(model, stop)
                summary = self.task.finish(self, stopped, stop.signum)
                if stopped and self.info.is_main:
                    self.say_stopped(stopped)
                barrier(self.info)
                return summary
        finally:
            self.task.close(self)

    def say_stopped(self, stopped: str) -> None:
        """The one stop message: where the run stopped and how to continue it."""
        how = (
            "run the same command again"
            if self.cfg.train.resume == "auto"
            else "run the same command with --resume auto"
        )
        print(
            f"stopped ({stopped}) at step {self.step}; checkpoint {self.out / LAST}; {how} to continue",
            file=sys.stderr,
            flush=True,
        )

    def iterate(self, model: nn.Module, stop: StopFlag) -> Optional[str]:
        """Steps until the schedule ends; the reason when it stops before."""
        c = self.cadence
        batches = self.task.batches(self.train_set, self.cfg, self.info, self.step)
        # smoothing 0: the rate is the mean since the warm-up step, so the ETA is sane from the second step
        pbar = progress_bar(total=c.iters, initial=self.step, desc="train", smoothing=0, progress=self.show)
        window = LogWindow(self.task.loss_keys)
        warm_up = self.step + 1
        model.train()
        try:
            while self.step < c.iters:
                losses, images = self.task.step(self, model, next(batches))
                self.step += 1
                window.add(losses, images)
                pbar.set_postfix(loss=f"{losses['loss'].item():.3f}", lr=f"{self.lr:.2e}", refresh=False)
                pbar.update(1)
                if self.step == warm_up:  # kernel build, compile, workers starting: not the loop's rate
                    restart_clock(pbar)
                if c.log(self.step):
                    self.task.record(self, window, losses, pbar)
                if stop_everywhere(stop.requested(), self.info):
                    self.save()
                    return "signal"
                if c.checkpoint(self.step):
                    self.save()
                if c.stop_early(self.step):
                    return "max_steps"
            return None
        finally:
            pbar.close()

    @property
    def lr(self) -> float:
        lr = self.optimizer.param_groups[0]["lr"]
        return float(lr) if torch.is_tensor(lr) else lr

    def checkpoint(self, ranks: list) -> dict:
        """The checkpoint: everything a resume needs (``ranks``: each process's RNG and
        :meth:`Task.rank_state`), the task's entries beside the run's."""
        return {
            "model": self.model.state_dict(),
            "optimizer": plain_state_dict(self.optimizer),  # as saved without CUDA graphs: resumable either way
            "scheduler": self.sched.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "model_ema": self.ema.module.state_dict() if self.ema is not None else None,
            "step": self.step,
            "history": self.history,
            "config": self.cfg.to_dict(),
            "rank_states": ranks,
            "elapsed_s": self.elapsed + time.time() - self.t_start,
            "world_size": self.info.world_size,
            **self.task.extra_state(self),
        }

    def save(self) -> Optional[pathlib.Path]:
        """Checkpoint (every rank contributes its RNG state and :meth:`Task.rank_state`; rank 0 writes)."""
        mine = {"rng": rng_state(), **self.task.rank_state(self)}
        ranks = [mine]
        if self.info.enabled:
            ranks = [None] * self.info.world_size
            dist.all_gather_object(ranks, mine)
        if not self.info.is_main:
            return None
        path = save_rotating(self.checkpoint(ranks), self.out)
        self.task.saved(self, path)
        return path

    def add_picture(self, summary: dict) -> None:
        """The task's picture of the run (validation predictions), its path in ``summary``."""
        try:
            args = (self.cfg, self.device, self.out, self.step, self.history, self.last_eval)
            key, path = self.task.picture(self.model, self.val_set, *args)
            summary[key] = str(path)
        except Exception as e:  # a picture is a report, never a reason to fail a finished run
            log.warning("predictions PNG failed: %s", e)
