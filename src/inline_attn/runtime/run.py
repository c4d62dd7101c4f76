"""One training run for every task: set-up, resume, the steps, checkpoints, signals and the
closing summary; each task supplies its hooks (:class:`~inline_attn.runtime.task.Task`).

``train(task, cfg)`` writes, from rank 0, into ``train.output``: ``config.yaml``, ``last.pth``
(atomically, at the task's checkpoint cadence, at the end and on SIGINT / SIGTERM; the one it
replaces kept as ``previous.pth``), ``metrics.csv``, ``summary.json`` and the task's own files (a
picture of validation predictions; classification's best checkpoints and curves). The task's
cadence says when a metrics row and a checkpoint are due: every so many iterations
(:class:`~inline_attn.runtime.task.Cadence`) or at the end of every epoch
(:class:`~inline_attn.runtime.task.EpochCadence`). Every checkpoint has one
format (:meth:`Run.checkpoint`: the run's entries, each process's RNG in ``rank_states``, the
task's entries beside them), read back by one reader
(:func:`~inline_attn.runtime.checkpoint.read_run_checkpoint`). The output folder is claimed first
(:func:`~inline_attn.runtime.output.hold_output`): a second run is refused while the first holds
it, and a new run into a folder holding a finished or interrupted one unless ``train.overwrite``,
whose move of the earlier run waits until every check of the set-up and the resume has passed.
``train.resume`` continues a run when its training-shaping settings (every setting not declared
``resume=True``), number of processes and weights fit (a ValueError naming what differs otherwise).

The summary says how a run ended: ``stopped`` is None (finished), ``"max_steps"`` or ``"signal"``
(``signal``: its number); :func:`~inline_attn.runtime.signals.exit_code` turns that into the
command's exit status.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from .amp import grad_scaler, resolve_amp
from .checkpoint import (
    BEST,
    BEST_EMA,
    LAST,
    RUN_KEYS,
    check_resume,
    copy_atomic,
    load_module,
    load_optimizer,
    load_resume,
    rank_states,
    read_run_checkpoint,
    rng_state,
    save_rotating,
    set_rng_state,
)
from .compile import compile_module
from .config import TypedConfig
from .distributed import SEED_STRIDE, DistInfo, all_reduce, barrier, run_session
from .finite import check_finite
from .ema import ModelEma
from .graphs import StepGraphs, compile_mode_for, graphs_line, why_not_graphed
from .optim import backward, optimizer_step, plain_state_dict
from .signals import StopFlag, stop_everywhere
from .output import hold_output
from .progress import progress_bar, restart_clock
from .report import TensorBoard, nan_to_none, write_csv, write_json
from .task import MicroBatches, Task

log = logging.getLogger(__name__)

__all__ = [
    "LogWindow",
    "Run",
    "keep_best",
    "seed_everything",
    "train",
]


@dataclass
class LogWindow:
    """This process's loss sums since the last metrics row: ``add`` after every step the losses
    times the images of each micro-batch (float64) and the images, ``row`` reduces them over the
    processes into means per image and the images per second. ``sums`` (the losses, the images)
    goes into every checkpoint, so a row after a resume counts the steps before it too."""

    keys: Sequence[str]
    sums: torch.Tensor = field(init=False)
    started: float = field(init=False, default_factory=time.time)
    images: int = 0  # since ``started``, in this process (timing only: not checkpointed)

    def __post_init__(self):
        self.sums = torch.zeros(len(self.keys) + 1, dtype=torch.float64)

    def add(self, sums: torch.Tensor) -> None:
        """``sums``: one step's [loss * images per key ..., images]."""
        self.sums += sums
        self.images += int(sums[-1])

    def row(self, info: DistInfo, present: Iterable[str]) -> dict:
        """``{key: mean per image}`` (None for a key not in ``present``), ``img_s`` and the
        window's ``window_s``; resets."""
        sums = all_reduce(torch.cat([self.sums, torch.tensor([float(self.images)], dtype=torch.float64)]), info)
        n, present = max(sums[-2].item(), 1), set(present)
        out = {k: sums[i].item() / n if k in present else None for i, k in enumerate(self.keys)}
        seconds = max(time.time() - self.started, 1e-9)
        out["img_s"], out["window_s"] = round(sums[-1].item() / seconds, 2), round(seconds, 2)
        self.sums.zero_()
        self.images, self.started = 0, time.time()
        return out


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
        cfg.check_processes(info.world_size)
        with hold_output(t.output, resume=t.resume, overwrite=t.overwrite, lock=info.is_main) as replace_earlier:
            return Run(task, cfg, info).train(replace_earlier)


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's generators from ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Run:
    """One training run: set-up, resume, the steps, checkpoints, signals, the closing summary.

    ``step`` counts optimizer steps, ``history`` holds the metrics rows, ``elapsed`` the training
    time of earlier processes (resumes), ``ema`` the EMA of the weights (or None), ``window`` the
    loss sums since the last row; the task's hooks read them, and only the run writes them.
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
        self.graphs, self.why_not, self.tb, self.new_row = None, None, TensorBoard(None), False
        self.window = LogWindow(task.loss_keys)
        self.t_start = time.time()
        self.setup()
        self.n_params = sum(p.numel() for p in self.model.parameters())

    def setup(self) -> None:
        """The data, the model (initialised alike on every process: DDP broadcasts it too), its
        optimizer, schedule and EMA, the input normalisation and the cadence, from the task."""
        cfg, task = self.cfg, self.task
        seed_everything(cfg.train.seed)
        self.train_set, self.val_set = task.datasets(cfg, self.info, self.show)
        seed_everything(cfg.train.seed)
        self.model = task.build_model(cfg, self.train_set.num_classes).to(self.device)
        self.optimizer, self.sched, decay = task.optimization(cfg, self.model)
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
        self.task.load_extra_state(self, where, state)
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
            if rank.get("partial") is not None and len(rank["partial"]) == len(self.window.sums):
                self.window.sums = rank["partial"].clone()

    def wrap(self) -> nn.Module:
        """The model to call: channels-last, DDP (the BatchNorm synchronised on GPUs where the task
        asks), a CUDA-graphed step or torch.compile, as the ``train`` section says."""
        t, info = self.cfg.train, self.info
        if t.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        model = self.model
        if info.enabled:
            if self.device.type == "cuda" and self.task.sync_bn:
                self.model = model = nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        setting, compile = t.cuda_graphs, t.compile
        if setting is not False:
            self.why_not = (
                why_not_graphed(
                    self.device,
                    model=self.model,
                    optimizer=self.optimizer,
                    amp=self.amp,
                    accum_steps=self.cadence.accum,
                    world_size=info.world_size,
                    compile=compile,
                )
                if self.task.criterion is not None
                else f"{self.task.kind}: {self.task.not_graphed}"
            )
        graphed = setting is not False and self.why_not is None
        line = graphs_line(setting, graphed, self.why_not, self.device, compile)
        if line and info.is_main:
            print(line, file=sys.stderr, flush=True)
        if compile:  # the fused InLine op stays one node of the graph (a custom op)
            model = compile_module(model, compile_mode_for(t.compile_mode, graphed))
        elif graphed:
            self.graphs = StepGraphs(self.amp, self.cfg.optim.clip_grad)
            if self.task.criterion_forward is not None:  # the step calls what gives the criterion its input
                model = self.task.criterion_forward(model)
        if info.is_main and t.tensorboard:
            self.tb = TensorBoard(self.out / "tb")
        return model

    def train(self, replace_earlier: Callable[[], None] = lambda: None) -> dict:
        """The run from its first step (or its checkpoint's) to the summary. ``replace_earlier``
        (:func:`~inline_attn.runtime.output.hold_output`'s) moves an earlier run in the output folder
        aside: called once the set-up and the resume have passed their checks, before anything is written."""
        try:
            self.resume_or_seed()
            replace_earlier()  # before wrap(), which opens the TensorBoard folder in the output
            model = self.wrap()
            # the handlers go in before config.yaml appears (the sign that a run has started), so a
            # signal from then on always ends in a checkpoint and the 128 + signum exit
            with StopFlag() as stop:
                if self.info.is_main:
                    self.out.mkdir(parents=True, exist_ok=True)
                    self.cfg.save(self.out / "config.yaml")
                self.t_start = time.time()
                stopped = self.iterate(model, stop)
                summary = self.finish(stopped, stop.signum)
                if stopped and self.info.is_main:
                    self.say_stopped(stopped)
                barrier(self.info)
                return summary
        finally:
            self.tb.close()

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
        warm_up = self.step + 1
        model.train()
        try:
            while self.step < c.iters:
                sums, present = self.train_step(model, next(batches))
                self.step += 1
                self.window.add(sums)
                loss = sums[0].item() / max(sums[-1].item(), 1)
                pbar.set_postfix(loss=f"{loss:.3f}", lr=f"{self.lr:.2e}", refresh=False)
                pbar.update(1)
                if self.step == warm_up:  # kernel build, compile, workers starting: not the loop's rate
                    restart_clock(pbar)
                if c.log(self.step):
                    self.record(present, pbar)
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

    def train_step(self, model: nn.Module, item) -> tuple[torch.Tensor, list]:
        """One optimizer step of ``model`` over ``item`` (a batch or its :class:`MicroBatches`),
        plain or its CUDA graph replayed: the schedule stepped, the EMA updated. Returns
        ([loss * images per loss key ..., images], the loss keys present)."""
        group = item if isinstance(item, MicroBatches) else MicroBatches(1, lambda: item)
        sums = torch.zeros(len(self.task.loss_keys) + 1, dtype=torch.float64)
        first = self.task.loss_keys[0]
        if self.graphs is not None:
            (batch,) = list(group)
            x = self.norm(batch[0].to(self.device, non_blocking=True))  # as the task's losses take it
            target = batch[1].to(self.device, non_blocking=True)
            out = self.graphs.train_step(model, self.optimizer, self.ema, self.task.criterion, x, target)
            terms = out if isinstance(out, dict) else {first: out}  # a criterion may give its terms
            check_finite(terms[first], f"step {self.step + 1}")
            n, present = len(x), [k for k in self.task.loss_keys if k in terms]
            values = torch.stack([terms[k].double() for k in present]).tolist()  # one host read
            for k, v in zip(present, values):
                sums[self.task.loss_keys.index(k)] = v * n
            sums[-1] = n
            self.sched.step()
            return sums, present
        self.optimizer.zero_grad(set_to_none=True)
        present: list = []
        for m, batch in enumerate(group):
            sync = m == len(group) - 1 or not self.info.enabled
            with contextlib.nullcontext() if sync else model.no_sync():
                losses, n = self.task.losses(model, batch, self.norm, self.device, self.amp)
                check_finite(losses[first], f"step {self.step + 1}")
                backward(losses[first] / len(group), self.scaler)
            values = [losses[k].item() * n if k in losses else 0.0 for k in self.task.loss_keys]
            sums += torch.tensor([*values, n], dtype=torch.float64)
            present = [k for k in self.task.loss_keys if k in losses]
        optimizer_step(self.model.parameters(), self.optimizer, self.scaler, self.cfg.optim.clip_grad)
        self.sched.step()
        if self.ema is not None:
            self.ema.update(self.model)
        return sums, present

    def evaluate(self) -> dict:
        """The task's evaluation of the model (and of its EMA: ``<best_key>_ema``), the model's
        training mode restored."""
        task, args = self.task, (self.val_set, self.cfg, self.device, self.info, self.amp, self.show)
        forward = self.graphs.eval_forward(self.model) if self.graphs is not None else None
        self.last_eval = task.evaluate(self.model, *args, forward=forward)
        row = {k: self.last_eval[k] for k in task.metric_keys}
        if self.ema is not None and task.best_key is not None:
            forward = self.graphs.eval_forward(self.ema.module) if self.graphs is not None else None
            row[f"{task.best_key}_ema"] = task.evaluate(self.ema.module, *args, forward=forward)[task.best_key]
        self.model.train()
        if task.metric_digits is not None:
            row = {k: round(v, task.metric_digits) for k, v in row.items()}
        return row

    def record(self, present: list, pbar) -> None:
        """A metrics row (evaluating when due), appended to the history and ``metrics.csv``."""
        c, task = self.cadence, self.task
        window = self.window.row(self.info, present)
        row = c.row(self.step, self.sched.lr_at)
        row.update({k: window[k] for k in task.loss_keys})
        if task.window_key:
            row[task.window_key] = window["window_s"]
        row[task.throughput_key] = window["img_s"]
        row["elapsed_s"] = round(self.elapsed + time.time() - self.t_start, 1)
        evaluated = c.evaluate(self.step)
        if evaluated:
            row.update(self.evaluate())
        self.history.append(row)
        self.new_row = True
        if self.info.is_main:
            head = c.line(self.step, evaluated)
            if head is not None:
                pbar.write(f"{head}  {task.eval_line(row)}", file=sys.stderr)
            write_csv(self.history, self.out / "metrics.csv", task.csv_columns)

    @property
    def lr(self) -> float:
        lr = self.optimizer.param_groups[0]["lr"]
        return float(lr) if torch.is_tensor(lr) else lr

    def checkpoint(self, ranks: list) -> dict:
        """The checkpoint: everything a resume needs (``ranks``: each process's RNG and loss
        sums), the task's entries beside the run's."""
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
        """Checkpoint (every rank contributes its RNG state and loss sums; rank 0 writes), then,
        after a new metrics row, the best copies, TensorBoard and the picture of a task that
        draws one each row."""
        mine = {"rng": rng_state(), "partial": self.window.sums.clone()}
        ranks = [mine]
        if self.info.enabled:
            ranks = [None] * self.info.world_size
            dist.all_gather_object(ranks, mine)
        if not self.info.is_main:
            return None
        path = save_rotating(self.checkpoint(ranks), self.out)
        if self.new_row:
            self.new_row = False
            if self.task.best_key is not None:
                keep_best(self.out, self.history, path, self.task.best_key)
            self.tb.log(self.history[-1])
            if self.task.picture_each_row:
                self.add_picture({})
        return path

    def finish(self, stopped: Optional[str], signum: Optional[int]) -> dict:
        """The summary of the run, one shape for every task; rank 0 writes it (``summary.json``,
        with the task's picture) when the run finished."""
        t, task = self.cfg.train, self.task
        summary = {
            **task.headline(self.cfg),
            "params": self.n_params,
            "steps": self.step,
            "world_size": self.info.world_size,
            "rank": self.info.rank,
            "device": str(self.device),
            "stopped": stopped,
            "signal": signum if stopped == "signal" else None,
            "train_time_s": round(self.elapsed + time.time() - self.t_start, 1),
            "checkpoint": str(self.out / LAST),
            "output": str(self.out),
        }
        summary["cuda_graphs"] = self.graphs_summary()
        classes = list(self.train_set.classes)
        summary.update(task.summary(self.cfg, self.model, self.history, self.last_eval, classes))
        for tag, name in (("", BEST), ("_ema", BEST_EMA)):
            if task.best_key is not None and (self.out / name).exists():
                summary[f"best{tag}_checkpoint"] = str(self.out / name)
        if self.info.is_main and stopped is None:
            if getattr(t, "predictions_png", True):  # a task section may turn its picture off
                self.add_picture(summary)
            write_json(nan_to_none(summary), self.out / "summary.json")
        return summary

    def graphs_summary(self) -> dict:
        """``train.cuda_graphs`` as it ran: the setting, whether the steps were graphed (or why not),
        and how many training / evaluation steps were replayed and run ungraphed in this process."""
        t = self.cfg.train
        out = {"setting": t.cuda_graphs, "graphed": False, "why_not": self.why_not}
        if self.graphs is not None:
            counts = self.graphs.counts()
            why_not = counts.pop("train_why_not", None)
            out.update(graphed=why_not is None and counts["train_replays"] > 0, why_not=why_not, **counts)
        elif t.compile and self.why_not is None and t.cuda_graphs is not False:
            out.update(graphed=True, how="torch.compile mode reduce-overhead")
        return out

    def add_picture(self, summary: dict) -> None:
        """The task's picture of the run, its path in ``summary``."""
        try:
            args = (self.cfg, self.device, self.out, self.step, self.history, self.last_eval)
            key, path = self.task.picture(self.model, self.val_set, *args)
            summary[key] = str(path)
        except Exception as e:  # a picture is a report, never a reason to fail a finished run
            log.warning("the run's picture failed: %s", e)


def keep_best(out: pathlib.Path, history: list[dict], path: pathlib.Path, key: str) -> None:
    """Copy the checkpoint ``path`` of the last row to best.pth / best_ema.pth in ``out`` when its
    ``key`` / ``<key>_ema`` is the best so far (a tie goes to the later row, as the authors' ``>=``)."""
    row = history[-1]
    for k, name in ((key, BEST), (f"{key}_ema", BEST_EMA)):
        value = row.get(k)
        before = [r[k] for r in history[:-1] if r.get(k) is not None]
        if value is not None and (not before or value >= max(before)):
            copy_atomic(path, out / name)
