"""One training run for every task: set-up, resume, the steps, checkpoints, signals and the
closing summary; each task supplies its hooks (:class:`Task`).

``train(task, cfg)`` writes, from rank 0, into ``train.output``: ``config.yaml``, ``last.pth``
(atomically, at the task's checkpoint cadence, at the end and on SIGINT / SIGTERM; the one it
replaces kept as ``previous.pth``), ``metrics.csv``, ``summary.json`` and the task's picture of
validation predictions. The output folder is claimed first
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
from .report import nan_to_none, write_csv, write_json

log = logging.getLogger(__name__)

__all__ = ["Run", "Task", "train"]


class Task:
    """What a task does its own way; :class:`Run` does the rest."""

    kind: str  # "segmentation" | "detection" (messages)
    config: type  # the typed config class
    csv_columns: list  # metrics.csv
    loss_keys: tuple  # the losses logged ("loss" first)
    metric_keys: tuple  # the evaluation numbers in a metrics row
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
        """The training batches from step ``step`` on."""
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
        with claim_output(t.output, resume=t.resume, overwrite=t.overwrite, lock=info.is_main):
            return Run(task, cfg, info).train()


class Run:
    """One training run: set-up, resume, the steps, the closing summary."""

    def __init__(self, task: Task, cfg: TypedConfig, info: DistInfo):
        self.task, self.cfg, self.info, self.device = task, cfg, info, info.device
        self.out = pathlib.Path(cfg.train.output)
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        self.show = info.is_main and cfg.train.progress
        self.train_set, self.val_set = task.datasets(cfg, self.show)
        torch.manual_seed(cfg.train.seed)
        np.random.seed(cfg.train.seed % 2**32)
        self.model = task.build_model(cfg, self.train_set.num_classes).to(self.device)
        self.n_params = count_params(self.model)
        self.optimizer, self.sched = task.optimization(cfg, self.model)
        self.amp = resolve_amp(cfg.train.amp, self.device)
        self.scaler = grad_scaler(self.amp)
        self.norm = task.input_norm(cfg).to(self.device)
        self.step, self.history, self.elapsed, self.last_eval = 0, [], 0.0, None
        self.cadence = task.cadence(cfg)

    def resume_or_seed(self) -> None:
        """Continue from ``train.resume`` after checking the checkpoint fits; else seed this rank."""
        found = load_resume(self.cfg.train.resume, self.out, self.task.load_checkpoint)
        if found is None:
            torch.manual_seed(self.cfg.train.seed + SEED_STRIDE * self.info.rank)  # dropout, drop path per rank
            return
        path, state = found
        where = f"checkpoint {str(path)!r}"
        check_resume(
            where, self.cfg.differences(state.get("config") or {}), state.get("world_size"), self.info.world_size
        )
        load_module(self.model, state["model"], where, "model")
        load_optimizer(self.optimizer, state["optimizer"], where)
        self.sched.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.step, self.history = int(state["step"]), list(state.get("history", []))
        self.elapsed = float(state.get("elapsed_s", 0.0))
        ranks = state.get("rng")
        ranks = [ranks] if isinstance(ranks, torch.Tensor) else (ranks or [])  # one process: a bare state
        if len(ranks) == self.info.world_size:
            torch.set_rng_state(ranks[self.info.rank])
        if self.info.is_main:
            log.info("resumed from %s at iteration %d", path, self.step)

    def wrapped(self) -> nn.Module:
        """The model to call: DDP over several processes, the heads' BatchNorm synchronised on GPUs
        (mmseg's SyncBN)."""
        if not self.info.enabled:
            return self.model
        if self.device.type == "cuda":
            self.model = nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
        ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(self.model, device_ids=ids)

    def train(self) -> dict:
        self.resume_or_seed()
        model = self.wrapped()
        with StopFlag() as stop:
            if self.info.is_main:
                self.cfg.save(self.out / "config.yaml")
            self.t_start = time.time()
            stopped = self.iterate(model, stop)
            return self.finish(stopped, stop.signum)

    def iterate(self, model: nn.Module, stop: StopFlag) -> Optional[str]:
        """Steps until the schedule ends; the reason when it stops before."""
        from tqdm import tqdm

        c = self.cadence
        batches = self.task.batches(self.train_set, self.cfg, self.info, self.step)
        bar = dict(desc="train", dynamic_ncols=True, mininterval=1.0, file=sys.stderr, disable=not self.show)
        pbar = tqdm(total=c.iters, initial=self.step, **bar)
        window = LogWindow(self.task.loss_keys)
        self.model.train()
        try:
            while self.step < c.iters:
                losses = self.one_step(model, next(batches), window)
                pbar.set_postfix(loss=f"{losses['loss'].item():.3f}", lr=f"{self.lr:.2e}", refresh=False)
                pbar.update(1)
                if c.log(self.step):
                    self.record(window.row(self.info, losses), pbar)
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

    def one_step(self, model: nn.Module, batch, window: LogWindow) -> dict:
        self.optimizer.zero_grad(set_to_none=True)
        losses, images = self.task.losses(model, batch, self.norm, self.device, self.amp)
        check_finite(losses["loss"], f"iteration {self.step}")
        backward(losses["loss"], self.scaler)
        optimizer_step(self.model.parameters(), self.optimizer, self.scaler, self.cfg.optim.clip_grad)
        self.sched.step()
        self.step += 1
        window.add(losses, images)
        return losses

    def record(self, row: dict, pbar) -> None:
        """A metrics row (evaluating when due), appended to the history and ``metrics.csv``."""
        row.update(step=self.step, lr=self.sched.lr_at(self.step - 1))
        row["elapsed_s"] = round(self.elapsed + time.time() - self.t_start, 1)
        if self.cadence.evaluate(self.step):
            args = (self.cfg, self.device, self.info, self.amp, self.show)
            self.last_eval = self.task.evaluate(self.model, self.val_set, *args)
            row.update({k: round(self.last_eval[k], 2) for k in self.task.metric_keys})
            if self.info.is_main:
                pbar.write(f"iteration {self.step}/{self.cadence.iters}  {self.task.eval_line(row)}")
            self.model.train()
        self.history.append(row)
        if self.info.is_main:
            write_csv(self.history, self.out / "metrics.csv", self.task.csv_columns)

    def save(self) -> Optional[pathlib.Path]:
        """Checkpoint (every rank contributes its RNG state; rank 0 writes)."""
        rng = [torch.get_rng_state()]
        if self.info.enabled:
            rng = [None] * self.info.world_size
            dist.all_gather_object(rng, torch.get_rng_state())
        if not self.info.is_main:
            return None
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.sched.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "step": self.step,
            "history": self.history,
            "config": self.cfg.to_dict(),
            "num_classes": self.train_set.num_classes,
            "classes": list(self.train_set.classes),
            "rng": rng,
            "elapsed_s": self.elapsed + time.time() - self.t_start,
            "world_size": self.info.world_size,
            **self.task.extras,
        }
        return save_rotating(state, self.out)

    def finish(self, stopped: Optional[str], signum: Optional[int]) -> dict:
        summary = {
            **self.task.headline(self.cfg),
            "params": self.n_params,
            "iterations": self.step,
            "world_size": self.info.world_size,
            "device": str(self.device),
            "stopped": stopped,
            "signal": signum if stopped == "signal" else None,
            "train_time_s": round(self.elapsed + time.time() - self.t_start, 1),
            "checkpoint": str(self.out / LAST),
            "output": str(self.out),
            "classes": list(self.train_set.classes),
        }
        summary.update(self.task.summary(self.cfg, self.history, self.last_eval, list(self.train_set.classes)))
        if self.info.is_main:
            if stopped is None and self.cfg.train.predictions_png:
                self.add_picture(summary)
            write_json(nan_to_none(summary), self.out / "summary.json")
            if stopped:
                how = f"stopped ({stopped}) at iteration {self.step}; continue with --train.resume auto"
                print(how, file=sys.stderr)
        barrier(self.info)
        return summary

    def add_picture(self, summary: dict) -> None:
        try:
            args = (self.cfg, self.device, self.out, self.step, self.last_eval)
            key, path = self.task.picture(self.model, self.val_set, *args)
            summary[key] = str(path)
        except Exception as e:  # a picture is a report, never a reason to fail a finished run
            log.warning("predictions PNG failed: %s", e)
