"""One training run for every task: set-up, resume, the steps, checkpoints, signals and the
closing summary; each task supplies its hooks (:class:`Task`).

``train(task, cfg)`` writes, from rank 0, into ``train.output``: ``config.yaml``, ``last.pth``
(atomically, at the task's checkpoint cadence, at the end and on SIGINT / SIGTERM; the one it
replaces kept as ``previous.pth``), ``metrics.csv``, ``summary.json`` and the task's own files (a
picture of validation predictions; classification's best checkpoints and curves). The task's
cadence says when a metrics row and a checkpoint are due: every so many iterations
(:class:`~inline_attn.runtime.loop.Cadence`) or at the end of every epoch
(:class:`~inline_attn.runtime.loop.EpochCadence`). The output folder is claimed first
(:func:`~inline_attn.runtime.output.claim_output`): a second run is refused while the first holds
it, and a new run into a folder holding a finished or interrupted one unless ``train.overwrite``.
``train.resume`` continues a run when its training-shaping settings (every setting not declared
``resume=True``), number of processes and weights fit (a ValueError naming what differs otherwise).

The summary says how a run ended: ``stopped`` is None (finished), ``"max_steps"`` or ``"signal"``
(``signal``: its number); :func:`~inline_attn.runtime.loop.exit_code` turns that into the
command's exit status.
"""

from __future__ import annotations

import logging
import os
import pathlib
import sys
import time
from typing import Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from ..models.profile import count_params
from .amp import grad_scaler, resolve_amp
from .checkpoint import LAST, check_resume, load_module, load_optimizer, load_resume, save_rotating
from .config import TypedConfig
from .distributed import SEED_STRIDE, DistInfo, barrier, run_session
from .loop import Cadence, LogWindow, StopFlag, backward, check_finite, optimizer_step, stop_everywhere
from .output import claim_output
from .progress import progress_bar, restart_clock
from .report import nan_to_none, write_csv, write_json

log = logging.getLogger(__name__)

__all__ = ["Run", "Task", "train"]


class Task:
    """What a task does its own way; :class:`Run` does the rest.

    The hooks below the set-up ones have defaults for an iteration-based task with one model,
    its optimizer and schedule (segmentation, detection); a task with another cadence or
    checkpoint (classification's epochs, EMA and best checkpoints) overrides them.
    """

    kind: str  # "segmentation" | "detection" | "classification" (messages)
    config: type  # the typed config class
    csv_columns: list  # metrics.csv
    loss_keys: tuple = ("loss",)  # the losses logged ("loss" first)
    metric_keys: tuple = ()  # the evaluation numbers in a metrics row
    distributed: bool = True  # whether the task trains on several processes
    extras: dict = {}  # saved in every checkpoint beside the state

    def datasets(self, cfg, progress: bool):
        """(train set, val set); both have ``classes`` and ``num_classes``."""
        raise NotImplementedError

    def build_model(self, cfg, num_classes: int) -> nn.Module:
        raise NotImplementedError

    def load_checkpoint(self, path) -> dict:
        """A checkpoint of this task read from ``path`` (ValueError naming the file when it is not one)."""
        raise NotImplementedError

    def optimization(self, cfg, model: nn.Module) -> tuple:
        """(optimizer, schedule): the schedule steps once per step and tells ``lr_at(step)``."""
        raise NotImplementedError

    def cadence(self, cfg) -> Cadence:
        """When the run logs, evaluates, checkpoints and stops."""
        raise NotImplementedError

    def input_norm(self, cfg) -> nn.Module:
        """What :meth:`losses` applies to the images (moved to the device by the run)."""
        return nn.Identity()

    def headline(self, cfg) -> dict:
        """The summary's first entries: what was trained."""
        return {}

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

    def picture(self, model, val_set, cfg, device, out: pathlib.Path, step: int, last_eval: Optional[dict]):
        """(summary key, path) of a PNG of validation predictions written into ``out``."""
        raise NotImplementedError

    # the run's hooks: defaults for an iteration-based task

    def check(self, cfg, info: DistInfo) -> None:
        """Refuse a config these processes cannot run, before the output folder is touched."""

    def setup(self, run: "Run") -> None:
        """Give ``run`` its ``train_set``, ``val_set``, ``model``, ``optimizer``, ``sched``,
        ``norm`` and ``cadence`` (``run.amp`` and ``run.scaler`` are set)."""
        cfg = run.cfg
        run.train_set, run.val_set = self.datasets(cfg, run.show)
        torch.manual_seed(cfg.train.seed)
        np.random.seed(cfg.train.seed % 2**32)
        run.model = self.build_model(cfg, run.train_set.num_classes).to(run.device)
        run.optimizer, run.sched = self.optimization(cfg, run.model)
        run.norm = self.input_norm(cfg).to(run.device)
        run.cadence = self.cadence(cfg)

    def seed_rank(self, cfg, rank: int) -> None:
        """Seed a fresh run's process ``rank`` (dropout, drop path and augmentation differ per rank)."""
        torch.manual_seed(cfg.train.seed + SEED_STRIDE * rank)

    def restore(self, run: "Run", path: pathlib.Path, state: dict) -> None:
        """Continue ``run`` from checkpoint ``state`` read from ``path``, after checking it fits."""
        where = f"checkpoint {str(path)!r}"
        check_resume(
            where, run.cfg.differences(state.get("config") or {}), state.get("world_size"), run.info.world_size
        )
        load_module(run.model, state["model"], where, "model")
        load_optimizer(run.optimizer, state["optimizer"], where)
        run.sched.load_state_dict(state["scheduler"])
        if run.scaler is not None and state.get("scaler"):
            run.scaler.load_state_dict(state["scaler"])
        run.step, run.history = int(state["step"]), list(state.get("history", []))
        run.elapsed = float(state.get("elapsed_s", 0.0))
        ranks = state.get("rng")
        ranks = [ranks] if isinstance(ranks, torch.Tensor) else (ranks or [])  # one process: a bare state
        if len(ranks) == run.info.world_size:
            torch.set_rng_state(ranks[run.info.rank])

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

    def rank_state(self, run: "Run"):
        """What each process contributes to a checkpoint (its RNG state)."""
        return torch.get_rng_state()

    def checkpoint(self, run: "Run", ranks: list) -> dict:
        """The checkpoint: everything a resume needs (``ranks``: :meth:`rank_state` of each process)."""
        return {
            "model": run.model.state_dict(),
            "optimizer": run.optimizer.state_dict(),
            "scheduler": run.sched.state_dict(),
            "scaler": run.scaler.state_dict() if run.scaler is not None else None,
            "step": run.step,
            "history": run.history,
            "config": run.cfg.to_dict(),
            "num_classes": run.train_set.num_classes,
            "classes": list(run.train_set.classes),
            "rng": ranks,
            "elapsed_s": run.elapsed + time.time() - run.t_start,
            "world_size": run.info.world_size,
            **self.extras,
        }

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
                self.add_picture(run, summary)
            write_json(nan_to_none(summary), run.out / "summary.json")
            if stopped:
                how = f"stopped ({stopped}) at iteration {run.step}; continue with --train.resume auto"
                print(how, file=sys.stderr)
        return summary

    def add_picture(self, run: "Run", summary: dict) -> None:
        try:
            args = (run.cfg, run.device, run.out, run.step, run.last_eval)
            key, path = self.picture(run.model, run.val_set, *args)
            summary[key] = str(path)
        except Exception as e:  # a picture is a report, never a reason to fail a finished run
            log.warning("predictions PNG failed: %s", e)

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


class Run:
    """One training run: set-up, resume, the steps, checkpoints, signals, the closing summary.

    ``step`` counts optimizer steps, ``history`` holds the metrics rows, ``elapsed`` the training
    time of earlier processes (resumes); the task's hooks read and set them.
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
        task.setup(self)
        self.n_params = count_params(self.model)

    def resume_or_seed(self) -> None:
        """Continue from ``train.resume`` (the task checks the checkpoint fits); else seed this rank."""
        found = load_resume(self.cfg.train.resume, self.out, self.task.load_checkpoint)
        if found is None:
            self.task.seed_rank(self.cfg, self.info.rank)
            return
        self.task.restore(self, *found)
        if self.info.is_main:
            log.info("resumed from %s at iteration %d", found[0], self.step)

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
                barrier(self.info)
                return summary
        finally:
            self.task.close(self)

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
        return self.optimizer.param_groups[0]["lr"]

    def save(self) -> Optional[pathlib.Path]:
        """Checkpoint (every rank contributes its :meth:`Task.rank_state`; rank 0 writes)."""
        ranks = [self.task.rank_state(self)]
        if self.info.enabled:
            ranks = [None] * self.info.world_size
            dist.all_gather_object(ranks, self.task.rank_state(self))
        if not self.info.is_main:
            return None
        path = save_rotating(self.task.checkpoint(self, ranks), self.out)
        self.task.saved(self, path)
        return path
