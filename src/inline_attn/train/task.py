"""The training entry point: one process or many (DDP), resumable, interruptible.

``train(cfg)`` runs the paper's recipe as the authors' code runs it (AdamW, timm's cosine with
warm-up/cool-down, lr, warmup_lr and min_lr scaled by total batch / 512, accumulation to a pinned
total batch, clipping, drop path, EMA with its decay scaled by the total batch, mixed precision,
mixup/cutmix with label smoothing, per-image augmentation on the training device, evaluation in
fp32) and writes, from rank 0 only: ``config.yaml``, ``last.pth`` (and ``previous.pth``),
``best.pth`` / ``best_ema.pth`` (the epochs with the best top-1), ``metrics.csv``, ``curves.png``,
``summary.json`` (and TensorBoard events when tensorboard is installed) into ``train.output``.
It runs as :class:`ClassifyTask` on the one run of every task (:mod:`inline_attn.runtime.run`,
which claims the output folder, resumes, stops on SIGINT / SIGTERM with a checkpoint and writes
``config.yaml``); checkpoints are :mod:`~inline_attn.train.checkpoint`'s.
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
import sys
import time
from typing import Iterator, Optional

import numpy as np
import torch
import torch.nn as nn

from ..data import DataInfo, EvalTransform, Mixup, TrainAugment
from ..models import create_model, get_model_config
from ..models.profile import profile
from ..runtime.amp import autocast
from ..runtime.checkpoint import LAST, copy_atomic
from ..runtime.compile import compile_module
from ..runtime.distributed import DistInfo, all_reduce_sum
from ..runtime.graphs import StepGraphs, compile_mode_for, graphs_line, why_not_graphed
from ..runtime.finite import check_finite
from ..models.timm_contract import layer_ids
from ..runtime.optim import CosineSchedule, backward, build_optimizer, optimizer_step
from ..runtime.report import write_json
from ..runtime.run import EpochCadence, Run, Task
from ..runtime.run import train as run_task
from . import checkpoint as ckpt_io
from .config import Config
from .data import Batches, build_datasets, data_info, loader_crops
from .finetune import load_initial_weights
from .evaluate import evaluate, soft_cross_entropy
from .recipe import Recipe, resolve
from .report import TensorBoard, plot_curves, write_metrics

log = logging.getLogger(__name__)

MIN_VAL_BATCH = 64


def model_kwargs(cfg: Config, data: DataInfo) -> dict:
    """create_model's overrides: class count, channels and size from the data, then model.kwargs."""
    kw = {"num_classes": data.num_classes}
    if data.in_chans != 3:
        kw["in_chans"] = data.in_chans
    if cfg.data.img_size or data.img_size != get_model_config(cfg.model.name).input_size[-1]:
        kw["img_size"] = data.img_size
    kw.update(cfg.model.kwargs)
    return kw


def check_model_args(cfg: Config, data: DataInfo) -> None:
    """Build the model on the meta device (no memory, no time) so a bad model.kwargs fails before the
    data is read; the class count is a stand-in when the data has not given it yet."""
    kwargs = {
        "drop_path_rate": cfg.model.drop_path,
        "drop_rate": cfg.model.drop,
        **model_kwargs(cfg, data.with_classes(data.num_classes or 1)),
    }
    try:
        with torch.device("meta"):
            create_model(cfg.model.name, **kwargs)
    except (TypeError, ValueError) as e:
        raise ValueError(f"model.name={cfg.model.name!r} with model.kwargs={cfg.model.kwargs}: {e}") from e


def build_model(cfg: Config, data: DataInfo) -> nn.Module:
    """create_model with the config's overrides; ``model.checkpoint`` initialises it for
    fine-tuning (:func:`~inline_attn.train.finetune.load_initial_weights`)."""
    kwargs = {"drop_path_rate": cfg.model.drop_path, "drop_rate": cfg.model.drop, **model_kwargs(cfg, data)}
    try:
        model = create_model(cfg.model.name, **kwargs)
    except TypeError as e:  # an override the constructor does not take
        raise ValueError(f"model {cfg.model.name!r} rejected its arguments {kwargs}: {e}") from e
    if cfg.model.grad_checkpointing:
        model.set_grad_checkpointing(True)
    if cfg.model.checkpoint:
        load_initial_weights(
            model,
            cfg.model.checkpoint,
            ema=cfg.model.checkpoint_ema,
            classifier=get_model_config(cfg.model.name).classifier,
        )
    return model


def train(
    cfg: Config, *, rank: Optional[int] = None, world_size: Optional[int] = None, init_method: Optional[str] = None
) -> dict:
    """Train with ``cfg`` (a :class:`~inline_attn.train.config.Config`) on the one run
    (:func:`inline_attn.runtime.run.train` with :class:`ClassifyTask`); returns the summary dict.

    ``rank``/``world_size``/``init_method`` join a process group explicitly (tests); under
    torchrun they come from the environment. A run stopped by SIGINT/SIGTERM saves a checkpoint
    and returns a summary with ``stopped="signal"`` and ``signal`` (its number). An output
    folder holding another run is refused unless ``train.resume`` or ``train.overwrite``
    (:func:`~inline_attn.runtime.output.claim_output`).
    """
    if not isinstance(cfg, Config):
        raise ValueError(f"train() takes a Config (inline_attn.train.Config.load), got {type(cfg).__name__}")
    return run_task(ClassifyTask(), cfg, rank=rank, world_size=world_size, init_method=init_method)


def build_schedule(
    cfg: Config, optimizer: torch.optim.Optimizer, recipe: Recipe, steps_per_epoch: int
) -> CosineSchedule:
    """timm 0.4.12's cosine with warm-up and cool-down, per optimizer step, at the recipe's lr."""
    s = cfg.sched
    return CosineSchedule(
        optimizer,
        lr=recipe.lr,
        steps_per_epoch=steps_per_epoch,
        epochs=s.epochs,
        warmup_epochs=s.warmup_epochs,
        cooldown_epochs=s.cooldown_epochs,
        warmup_lr=recipe.warmup_lr,
        min_lr=recipe.min_lr,
    )


def _batches(cfg: Config, train_set, val_set, info: DistInfo) -> tuple[Batches, Batches]:
    """The training batches (shuffled per epoch, this rank's share) and the validation batches."""
    bs, workers, pin = cfg.data.batch_size, cfg.data.workers, info.device.type == "cuda"
    shard = dict(rank=info.rank, world_size=info.world_size, workers=workers, pin_memory=pin)
    train_batches = Batches(train_set, bs, train=True, seed=cfg.train.seed, **shard)
    return train_batches, Batches(val_set, max(bs, MIN_VAL_BATCH), train=False, **shard)


def _plan_graphs(
    cfg: Config, info: DistInfo, amp: str, accum: int, model: nn.Module, optimizer
) -> tuple[bool, Optional[str]]:
    """``train.cuda_graphs`` on this run: (graphed?, why not), the one line said on rank 0."""
    t = cfg.train
    why_not = None
    if t.cuda_graphs is not False:
        why_not = why_not_graphed(
            info.device,
            model=model,
            optimizer=optimizer,
            amp=amp,
            accum_steps=accum,
            world_size=info.world_size,
            compile=t.compile,
        )
    graphed = t.cuda_graphs is not False and why_not is None
    line = graphs_line(t.cuda_graphs, graphed, why_not, info.device, t.compile)
    if line and info.is_main:
        print(line, file=sys.stderr, flush=True)
    return graphed, why_not


def _train_augment(cfg: Config, data: DataInfo) -> TrainAugment:
    """The per-image augmentation of the training batches (on the training device)."""
    a = cfg.aug
    return TrainAugment(
        data.img_size,
        data.mean,
        data.std,
        crop="none" if loader_crops(cfg.data, a) else a.crop,
        scale=a.scale,
        ratio=a.ratio,
        padding=a.padding,
        hflip=a.hflip,
        auto_augment=a.auto_augment,
        color_jitter=a.color_jitter,
        re_prob=a.re_prob,
        interpolation=data.interpolation,
    )


def _best(history: list[dict], key: str) -> Optional[dict]:
    """``{"value", "epoch"}`` (epoch counted from 1) of the best ``key`` in ``history``; ties: the later."""
    best = None
    for r in history:
        if r.get(key) is not None and (best is None or r[key] >= best["value"]):
            best = {"value": r[key], "epoch": r["epoch"] + 1}
    return best


def keep_best(out: pathlib.Path, history: list[dict], path: pathlib.Path) -> None:
    """Copy the epoch's checkpoint ``path`` to best.pth / best_ema.pth in ``out`` when its top-1 /
    EMA top-1 is the best so far (a tie goes to the later epoch, as the authors' ``>=``)."""
    row = history[-1]
    for key, name in (("val_top1", ckpt_io.BEST), ("val_top1_ema", ckpt_io.BEST_EMA)):
        value = row.get(key)
        before = [r[key] for r in history[:-1] if r.get(key) is not None]
        if value is not None and (not before or value >= max(before)):
            copy_atomic(path, out / name)


def _epoch_line(row: dict, total_epochs: int) -> str:
    msg = (
        f"epoch {row['epoch'] + 1}/{total_epochs}  train_loss {row['train_loss']:.4f}  "
        f"lr {row['lr']:.2e}  {row['train_img_s']:.0f} img/s"
    )
    if row.get("val_top1") is not None:
        msg += f"  val_top1 {row['val_top1']:.2f}  val_top5 {row['val_top5']:.2f}"
    if row.get("val_top1_ema") is not None:
        msg += f"  ema_top1 {row['val_top1_ema']:.2f}"
    return msg


class ClassifyTask(Task):
    """Image classification on the one run (:class:`~inline_attn.runtime.run.Run`), in epochs.

    A step is one optimizer step over ``accum`` micro-batches (augmented on the device, mixed),
    plain or replayed as a CUDA graph, the run's EMA updated after it; each epoch ends in a
    metrics row (the loss summed over the processes, top-1 / top-5 of the model and its EMA in
    fp32 when due), a checkpoint (with each process's partial loss sums beside its RNG state, so
    a resume mid-epoch is bit-exact), best.pth / best_ema.pth, ``metrics.csv`` and ``curves.png``.
    It keeps where the run stands in the epoch (``epoch``, ``step_in_epoch``, ``partial``).
    """

    kind = "classification"
    config = Config
    checkpoint_keys = ("epoch", "step_in_epoch")

    def check(self, cfg: Config, info: DistInfo) -> None:
        """The recipe: a total batch these processes cannot reach fails here."""
        self.recipe, self.info = resolve(cfg, info.world_size), info
        self.epoch, self.step_in_epoch, self.partial = 0, 0, torch.zeros(2, dtype=torch.float64)
        self.row, self.graphs, self.tb = None, None, None

    def datasets(self, cfg: Config, progress: bool):
        """The data (checked against the model first) and its batches, this process's share."""
        info = self.info
        self.model_cfg = get_model_config(cfg.model.name)
        data = data_info(cfg.data, self.model_cfg)
        check_model_args(cfg, data)
        train_set, val_set, self.data = build_datasets(cfg.data, data, aug=cfg.aug, seed=cfg.train.seed)
        if cfg.data.on_device:  # gathered on the device: no host copy a step (the GPU preset)
            train_set, val_set = train_set.to(info.device), val_set.to(info.device)
        self.train_batches, self.val_batches = _batches(cfg, train_set, val_set, info)
        self.accum = self.recipe.accum_steps
        self.steps_per_epoch = len(self.train_batches) // self.accum
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"an epoch has {len(self.train_batches)} batches, fewer than optim.accum_steps={self.accum}"
            )
        return train_set, val_set

    def build_model(self, cfg: Config, num_classes: int) -> nn.Module:
        return build_model(cfg, self.data)

    def optimization(self, cfg: Config, model: nn.Module) -> tuple:
        o = cfg.optim
        layers = None if o.layer_decay is None else layer_ids(model)
        optimizer = build_optimizer(
            model, o.opt, self.recipe.lr, o.weight_decay, o.betas, o.eps, o.no_weight_decay, (o.layer_decay, layers)
        )
        return optimizer, build_schedule(cfg, optimizer, self.recipe, self.steps_per_epoch)

    def ema_decay(self, cfg: Config) -> Optional[float]:
        return self.recipe.ema_decay

    def cadence(self, cfg: Config) -> EpochCadence:
        self.total_epochs = cfg.sched.epochs + cfg.sched.cooldown_epochs
        spe = self.steps_per_epoch
        if self.info.is_main:
            print(f"recipe: {self.recipe.describe()}", file=sys.stderr, flush=True)
        return EpochCadence(self.total_epochs * spe, spe, spe, spe, cfg.train.max_steps)

    def load_extra_state(self, run: Run, where: str, state: dict, rank: Optional[dict]) -> None:
        """Where the epoch stood, and this rank's partial sums (the epoch must have as many steps)."""
        saved_steps = state.get("steps_per_epoch")
        if saved_steps is not None and int(saved_steps) != self.steps_per_epoch:
            raise ValueError(
                f"cannot resume from {where}: an epoch had {saved_steps} steps, now {self.steps_per_epoch} "
                "(the training data changed)"
            )
        self.epoch, self.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])
        if rank is not None:
            self.partial = rank["partial"].clone()

    def wrap(self, run: Run) -> nn.Module:
        """channels_last, DDP, CUDA graphs or torch.compile as configured; the augmentation."""
        cfg, info = run.cfg, run.info
        if cfg.train.channels_last:
            run.model = run.model.to(memory_format=torch.channels_last)
        model = run.model
        if info.enabled:
            ids = [info.device.index] if info.device.type == "cuda" else None
            model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        graphed, self.why_not = _plan_graphs(cfg, info, run.amp, self.accum, run.model, run.optimizer)
        if cfg.train.compile:  # the fused InLine op stays one node of the graph (a custom op)
            model = compile_module(model, compile_mode_for(cfg.train.compile_mode, graphed))
        self.graphs = StepGraphs(run.amp, cfg.optim.clip_grad) if graphed and not cfg.train.compile else None
        d, a = self.data, cfg.aug
        self.train_aug = _train_augment(cfg, d).to(info.device)
        self.mixup = Mixup(d.num_classes, a.mixup, a.cutmix, a.mixup_prob, a.mixup_switch_prob, a.smoothing)
        self.eval_tf = EvalTransform(d.img_size, d.mean, d.std, d.crop_pct, d.interpolation, d.eval_resize)
        self.eval_tf = self.eval_tf.to(info.device)
        self.tb = TensorBoard(run.out / "tb" if (info.is_main and cfg.train.tensorboard) else None)
        return model

    def batches(self, train_set, cfg: Config, info: DistInfo, step: int) -> Iterator:
        """The epoch's batch iterator once a step (the step takes its ``accum`` micro-batches from
        it), from the epoch and the step in it on."""
        while True:
            it = self.train_batches.iterate(self.epoch, self.step_in_epoch * self.accum)
            self.t_epoch, self.seen = time.time(), 0
            for _ in range(self.step_in_epoch, self.steps_per_epoch):
                yield it

    def losses(self, model: nn.Module, batch, norm: nn.Module, device: torch.device, amp: str) -> tuple[dict, int]:
        """The soft-target cross-entropy of ``batch`` (images, soft targets, labels), and its size."""
        x, target, y = batch
        with autocast(device, amp):
            logits = model(x)
        return {"loss": soft_cross_entropy(logits, target)}, y.numel()

    def _batch(self, run: Run, it) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next batch on the device, augmented and mixed: (images, soft targets, labels)."""
        x, y = next(it)
        x = self.train_aug(x.to(run.device, non_blocking=True))
        if run.cfg.train.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        y = y.to(run.device, non_blocking=True)
        x, target = self.mixup(x, y)
        return x, target, y

    def step(self, run: Run, model: nn.Module, it) -> tuple[dict, int]:
        """One optimizer step over ``accum`` micro-batches (or its CUDA graph replayed)."""
        step_loss = self._graphed_step(run, model, it) if self.graphs is not None else self._plain_step(run, model, it)
        self.step_in_epoch += 1
        self.partial += step_loss
        self.seen += int(step_loss[1])
        return {"loss": step_loss[0] / step_loss[1]}, int(step_loss[1])

    def _plain_step(self, run: Run, model: nn.Module, it) -> torch.Tensor:
        """[loss sum, samples] of one step: ``accum`` micro-batches, DDP syncing on the last."""
        run.optimizer.zero_grad(set_to_none=True)
        step_loss = torch.zeros(2, dtype=torch.float64)
        for m in range(self.accum):
            batch = self._batch(run, it)
            sync = m == self.accum - 1 or not run.info.enabled
            with contextlib.nullcontext() if sync else model.no_sync():
                losses, n = self.losses(model, batch, run.norm, run.device, run.amp)
                loss = losses["loss"]
                check_finite(loss, f"epoch {self.epoch}, step {run.step}")
                backward(loss / self.accum, run.scaler)
            step_loss += torch.tensor([loss.item() * n, n], dtype=torch.float64)
        optimizer_step(run.model.parameters(), run.optimizer, run.scaler, run.cfg.optim.clip_grad)
        run.sched.step()
        if run.ema is not None:
            run.ema.update(run.model)
        return step_loss

    def _graphed_step(self, run: Run, model: nn.Module, it) -> torch.Tensor:
        """:meth:`_plain_step` through :attr:`graphs` (one micro-batch, no scaler): the step with its
        EMA update replayed, the loss read after it, then the schedule written into the tensor lr."""
        x, target, y = self._batch(run, it)
        loss = self.graphs.train_step(model, run.optimizer, run.ema, soft_cross_entropy, x, target)
        check_finite(loss, f"epoch {self.epoch}, step {run.step}")
        step_loss = torch.tensor([loss.item() * y.numel(), y.numel()], dtype=torch.float64)
        run.sched.step()
        return step_loss

    def record(self, run: Run, window, losses: dict, pbar) -> None:
        """The end of an epoch: its loss reduced over the processes, evaluation when due; the
        history row and its line (the files follow in :meth:`saved`, after the epoch's checkpoint)."""
        info = run.info
        epoch_time = time.time() - self.t_epoch
        sums = all_reduce_sum(self.partial.clone(), info)
        row = {
            "epoch": self.epoch,
            "step": run.step,
            "lr": run.sched.get_last_lr(),
            "train_loss": sums[0].item() / max(sums[1].item(), 1),
            "epoch_time_s": round(epoch_time, 2),
            "train_img_s": round(self.seen * info.world_size / max(epoch_time, 1e-9), 1),
        }
        if (self.epoch + 1) % run.cfg.train.eval_every == 0 or self.epoch + 1 == self.total_epochs:
            row.update(self.evaluate(run.model, run.val_set, run.cfg, run.device, info, "none", run.show, run.ema))
        run.history.append(row)
        self.epoch, self.step_in_epoch = self.epoch + 1, 0
        self.partial.zero_()
        self.row = row
        if info.is_main:
            pbar.write(self.eval_line(row), file=sys.stderr)

    def evaluate(self, model, val_set, cfg, device, info, amp, progress, ema=None) -> dict:
        """val_loss / val_top1 / val_top5 (and val_top1_ema), in fp32 whatever the training
        precision (the authors' validate())."""
        graphs = self.graphs
        forward = graphs.eval_forward(model) if graphs is not None else None
        ev = evaluate(model, self.val_batches, self.eval_tf, info.device, info, amp, forward)
        out = dict(val_loss=ev["loss"], val_top1=ev["top1"], val_top5=ev["top5"])
        if ev["n_unreadable"] and info.is_main:
            log.warning("validation: %d images scored, %d unreadable skipped", ev["n"], ev["n_unreadable"])
        if ema is not None:
            forward = graphs.eval_forward(ema.module) if graphs is not None else None
            out["val_top1_ema"] = evaluate(ema.module, self.val_batches, self.eval_tf, info.device, info, amp, forward)[
                "top1"
            ]
        return out

    def eval_line(self, row: dict) -> str:
        return _epoch_line(row, self.total_epochs)

    def rank_state(self, run: Run) -> dict:
        return {"partial": self.partial.clone()}

    def extra_state(self, run: Run) -> dict:
        """Where the epoch stands, and what evaluation needs to rebuild the model."""
        return {
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "steps_per_epoch": self.steps_per_epoch,
            "model_name": run.cfg.model.name,
            "model_kwargs": model_kwargs(run.cfg, self.data),
            "pretrained_cfg": self.model_cfg.to_dict(),
        }

    def saved(self, run: Run, path: pathlib.Path) -> None:
        """At an epoch's end: best.pth / best_ema.pth, metrics.csv, TensorBoard, curves.png."""
        if self.row is None:
            return
        row, self.row, history = self.row, None, run.history
        keep_best(run.out, history, path)
        write_metrics(history, run.out / "metrics.csv")
        self.tb.log(row)
        self.picture(run.model, run.val_set, run.cfg, run.device, run.out, run.step, history, None)

    def picture(self, model, val_set, cfg, device, out: pathlib.Path, step: int, history: list, last_eval) -> tuple:
        """The training curves so far (loss and top-1 per epoch)."""
        plot_curves(history, out / "curves.png", title=cfg.model.name)
        return "curves", out / "curves.png"

    def graphs_summary(self, cfg: Config) -> dict:
        """``train.cuda_graphs`` as it ran: the setting, whether the steps were graphed (or why not),
        and how many training / evaluation steps were replayed and run ungraphed in this process."""
        out = {"setting": cfg.train.cuda_graphs, "graphed": False, "why_not": self.why_not}
        if self.graphs is not None:
            counts = self.graphs.counts()
            why_not = counts.pop("train_why_not", None)
            out.update(graphed=why_not is None and counts["train_replays"] > 0, why_not=why_not, **counts)
        elif cfg.train.compile and self.why_not is None and cfg.train.cuda_graphs is not False:
            out.update(graphed=True, how="torch.compile mode reduce-overhead")
        return out

    def finish(self, run: Run, stopped: Optional[str], signum: Optional[int]) -> dict:
        info, history = run.info, run.history
        summary = {
            "model": run.cfg.model.name,
            "model_kwargs": run.cfg.model.kwargs,
            "params": run.n_params,
            "epochs_done": len(history),
            "steps": run.step,
            "world_size": info.world_size,
            "rank": info.rank,
            "device": str(info.device),
            "stopped": stopped,
            "signal": signum if stopped == "signal" else None,
            "checkpoint": str(run.out / LAST),
            "output": str(run.out),
            "recipe": self.recipe.to_dict(),
            "cuda_graphs": self.graphs_summary(run.cfg),
        }
        if history:
            summary.update(self.summary(run.cfg, history, None, []))
            for tag, name in (("", ckpt_io.BEST), ("_ema", ckpt_io.BEST_EMA)):
                if f"best_val_top1{tag}" in summary:
                    summary[f"best{tag}_checkpoint"] = str(run.out / name)
        if stopped is None:
            summary["train_time_s"] = round(run.elapsed + time.time() - run.t_start, 1)
            if info.is_main:
                self._write_summary(run, summary)
        return summary

    def summary(self, cfg: Config, history: list, last_eval: Optional[dict], classes: list) -> dict:
        """The last epoch's numbers, the median throughput and the best epochs."""
        last = history[-1]
        res = {
            "final": {k: last.get(k) for k in ("train_loss", "val_loss", "val_top1", "val_top5", "val_top1_ema")},
            "train_img_s": round(float(np.median([r["train_img_s"] for r in history])), 1),
        }
        for key, tag in (("val_top1", ""), ("val_top1_ema", "_ema")):
            best = _best(history, key)
            if best is not None:
                res[f"best_val_top1{tag}"] = best["value"]
                res[f"best{tag}_epoch"] = best["epoch"]
        return res

    def _write_summary(self, run: Run, summary: dict) -> None:
        d = self.data
        try:
            summary["macs"] = profile(run.model, (d.in_chans, d.img_size, d.img_size)).macs
        except Exception as e:  # counting is a report, never a reason to fail a finished run
            log.warning("MAC count failed: %s", e)
        summary["curves"] = str(run.out / "curves.png")
        write_json(summary, run.out / "summary.json")

    def close(self, run: Run) -> None:
        if self.tb is not None:
            self.tb.close()
