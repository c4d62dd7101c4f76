"""One training loop for segmentation and detection: iteration-based, one process or many
(torchrun), resumable, interruptible, with AMP; each task supplies its hooks (:class:`DenseTask`).

``train_dense(task, cfg)`` writes, from rank 0, into ``train.output``: ``config.yaml``,
``last.pth`` (atomically, every ``train.checkpoint_interval`` iterations, at the end and on
SIGINT / SIGTERM; the one it replaces kept as ``previous.pth``), ``metrics.csv``,
``summary.json`` and the task's picture of validation predictions. A second run on the same
output folder is refused while the first holds it. ``train.resume`` continues a run when its
training-shaping settings, number of processes and weights fit (a ValueError naming what
differs otherwise).
"""

from __future__ import annotations

import logging
import pathlib
import sys
import time
from typing import Callable, Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from ..data.transforms import Normalize
from ..models.checkpoint import read_checkpoint, unwrap_state_dict
from ..models.profile import count_params
from ..runtime.amp import grad_scaler, resolve_amp
from ..runtime.checkpoint import LAST, check_resume, load_module, load_optimizer, load_resume, save_rotating
from ..runtime.config import TypedConfig
from ..runtime.distributed import SEED_STRIDE, DistInfo, barrier, run_session
from ..runtime.loop import (
    Cadence,
    LogWindow,
    OutputLock,
    StopFlag,
    backward,
    check_finite,
    optimizer_step,
    stop_everywhere,
)
from ..runtime.optim import PolySchedule, build_optimizer
from ..runtime.report import nan_to_none, write_csv, write_json
from .config import RESUME_MAY_CHANGE

log = logging.getLogger(__name__)

__all__ = ["DenseTask", "build_dense_model", "load_run_checkpoint", "load_trained", "load_weights", "train_dense"]


def build_dense_model(cfg: TypedConfig, num_classes: int, builder: Callable, head_key: str) -> nn.Module:
    """``builder(backbone=..., num_classes=..., backbone_kwargs=..., **head settings)`` for the
    config's model section (weights from ``model.checkpoint`` when set; the backbone's from
    ``model.pretrained``); ``head_key`` names the classifier weight for mismatch messages."""
    m = cfg.model
    if m.num_classes is not None and m.num_classes != num_classes:
        raise ValueError(f"model.num_classes={m.num_classes} but the dataset has {num_classes} classes")
    try:
        model = builder(
            backbone=m.backbone,
            num_classes=num_classes,
            backbone_kwargs=m.backbone_kwargs_for_build(),
            **m.head_kwargs(),
        )
    except TypeError as e:  # a backbone_kwargs entry the model does not take
        raise ValueError(f"backbone {m.backbone!r} rejected model.backbone_kwargs {m.backbone_kwargs}: {e}") from e
    if m.checkpoint:
        load_weights(model, m.checkpoint, head_key)
    return model


def load_weights(model: nn.Module, path, head_key: str) -> None:
    """Load whole-model weights (a ``last.pth`` of ours or a bare state dict), strictly: a
    checkpoint of another backbone or class count (the rows of ``head_key``, the classifier's
    weight) raises ValueError saying which."""
    sd = unwrap_state_dict(read_checkpoint(path, weights_only=False), where=repr(str(path)))
    own = model.state_dict()
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    shapes = [
        f"{k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in sd and sd[k].shape != own[k].shape
    ]
    if missing or unexpected or shapes:
        cls = own[head_key].shape[0]
        got = sd.get(head_key)
        hint = (
            f"; the checkpoint predicts {got.shape[0]} classes, the model {cls}"
            if got is not None and got.shape[0] != cls
            else ""
        )
        raise ValueError(
            f"checkpoint {path} does not fit the model (other backbone or head?){hint}: "
            f"{len(missing)} missing (e.g. {missing[:3]}), {len(unexpected)} unexpected "
            f"(e.g. {unexpected[:3]}), {len(shapes)} of another shape (e.g. {shapes[:2]})"
        )
    model.load_state_dict(sd)


def load_run_checkpoint(path, keys, kind: str) -> dict:
    """A checkpoint written by :func:`train_dense` for ``kind`` (``keys`` it must hold);
    ValueError naming the file when it is not one."""
    state = read_checkpoint(path, weights_only=False)  # ours: configs and RNG states beside the weights
    missing = [k for k in keys if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(
            f"{path} is not a {kind} checkpoint of inline-attn (no {', '.join(missing)}); "
            f"to start from its weights use --model.checkpoint or --model.pretrained"
        )
    return state


def load_trained(task: "DenseTask", path, state: dict, device="cpu") -> tuple[nn.Module, TypedConfig]:
    """(model, config) of the run that wrote ``state``, the checkpoint read from ``path``: its
    config without the starting weights (``model.checkpoint``, ``model.pretrained``), the model
    built for its class count, the trained weights loaded strictly, on ``device``."""
    cfg = task.config.from_dict(state["config"]).replace(**{"model.checkpoint": None, "model.pretrained": None})
    model = task.build_model(cfg, int(state["num_classes"]))
    load_weights(model, path, task.head_key)
    return model.to(device), cfg


class DenseTask:
    """What segmentation and detection do differently; :func:`train_dense` does the rest."""

    kind: str  # "segmentation" | "detection" (messages)
    config: type  # the typed config class
    head_key: str  # the classifier's weight (its rows: the classes), for mismatch messages
    checkpoint_keys: tuple  # what a checkpoint of the task holds
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
        return load_run_checkpoint(path, self.checkpoint_keys, self.kind)

    def batches(self, train_set, cfg, info: DistInfo, step: int) -> Iterator:
        """The training batches from iteration ``step`` on."""
        raise NotImplementedError

    def losses(self, model: nn.Module, batch, norm: Normalize, device: torch.device, amp: str) -> tuple[dict, int]:
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


def train_dense(
    task: DenseTask,
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
    with run_session(
        cfg.train.device, cfg.train.threads, rank=rank, world_size=world_size, init_method=init_method
    ) as info:
        if info.enabled and not task.distributed:
            raise ValueError(f"{task.kind} training runs in one process (got world size {info.world_size})")
        return _Run(task, cfg, info).train()


class _Run:
    """One training run: set-up, resume, the iterations, the closing summary."""

    def __init__(self, task: DenseTask, cfg: TypedConfig, info: DistInfo):
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
        o, s = cfg.optim, cfg.sched
        self.optimizer = build_optimizer(self.model, o.opt, o.lr, o.weight_decay, o.betas, o.eps)
        self.sched = PolySchedule(
            self.optimizer,
            lr=o.lr,
            iters=s.iters,
            power=s.power,
            min_lr=s.min_lr,
            warmup_iters=s.warmup_iters,
            warmup_ratio=s.warmup_ratio,
        )
        self.amp = resolve_amp(cfg.train.amp, self.device)
        self.scaler = grad_scaler(self.amp)
        self.norm = Normalize(cfg.data.mean, cfg.data.std).to(self.device)
        self.step, self.history, self.elapsed, self.last_eval = 0, [], 0.0, None
        t = cfg.train
        self.cadence = Cadence(s.iters, t.log_interval, cfg.eval.interval, t.checkpoint_interval, t.max_steps)

    def resume_or_seed(self) -> None:
        """Continue from ``train.resume`` after checking the checkpoint fits; else seed this rank."""
        found = load_resume(self.cfg.train.resume, self.out, self.task.load_checkpoint)
        if found is None:
            torch.manual_seed(self.cfg.train.seed + SEED_STRIDE * self.info.rank)  # dropout, drop path per rank
            return
        path, state = found
        where = f"checkpoint {str(path)!r}"
        diffs = self.cfg.differences(state.get("config") or {}, RESUME_MAY_CHANGE)
        check_resume(where, diffs, state.get("world_size"), self.info.world_size)
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
        with StopFlag() as stop, OutputLock(self.out, enabled=self.info.is_main):
            if self.info.is_main:
                self.cfg.save(self.out / "config.yaml")
            self.t_start = time.time()
            stopped = self.iterate(model, stop)
            return self.finish(stopped, stop.signum)

    def iterate(self, model: nn.Module, stop: StopFlag) -> Optional[str]:
        """Iterations until the schedule ends; the reason when it stops before."""
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
            "backbone": self.cfg.model.backbone,
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
