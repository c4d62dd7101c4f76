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
import random
import sys
import time
from typing import Iterator, Optional

import numpy as np
import torch
import torch.nn as nn

from ..data import DataInfo, EvalTransform, Mixup, TrainAugment
from ..models import create_model, get_model_config
from ..models.profile import profile
from ..runtime.amp import autocast, grad_scaler
from ..runtime.checkpoint import LAST, copy_atomic, rng_state, set_rng_state
from ..runtime.compile import compile_module
from ..runtime.distributed import SEED_STRIDE, DistInfo, all_reduce_sum
from ..runtime.ema import ModelEma
from ..runtime.graphs import compile_mode_for
from ..runtime.finite import check_finite
from ..models.timm_contract import layer_ids
from ..runtime.optim import backward, optimizer_step
from ..runtime.run import EpochCadence
from ..runtime.optim import CosineSchedule, build_optimizer
from ..runtime.report import write_json
from ..runtime.run import Run, Task
from ..runtime.run import train as run_task
from . import checkpoint as ckpt_io
from .config import Config
from .data import Batches, build_datasets, data_info, loader_crops
from .finetune import load_initial_weights
from .graphs import StepGraphs, announce
from .graphs import plan as plan_graphs
from .evaluate import evaluate, soft_cross_entropy
from .recipe import Recipe, resolve
from .report import TensorBoard, plot_curves, write_metrics
from .state import TrainState

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


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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


def _new_state(cfg: Config, model: nn.Module, recipe: Recipe, steps_per_epoch: int, amp: str) -> TrainState:
    o, s = cfg.optim, cfg.sched
    layers = None if o.layer_decay is None else layer_ids(model)
    optimizer = build_optimizer(
        model, o.opt, recipe.lr, o.weight_decay, o.betas, o.eps, o.no_weight_decay, layer_decay=(o.layer_decay, layers)
    )
    sched = CosineSchedule(
        optimizer,
        lr=recipe.lr,
        steps_per_epoch=steps_per_epoch,
        epochs=s.epochs,
        warmup_epochs=s.warmup_epochs,
        cooldown_epochs=s.cooldown_epochs,
        warmup_lr=recipe.warmup_lr,
        min_lr=recipe.min_lr,
    )
    scaler = grad_scaler(amp)
    ema = ModelEma(model, recipe.ema_decay) if recipe.ema_decay is not None else None
    return TrainState(model, optimizer, sched, scaler, ema)


def _batches(cfg: Config, train_set, val_set, info: DistInfo) -> tuple[Batches, Batches]:
    """The training batches (shuffled per epoch, this rank's share) and the validation batches."""
    bs, workers, pin = cfg.data.batch_size, cfg.data.workers, info.device.type == "cuda"
    shard = dict(rank=info.rank, world_size=info.world_size, workers=workers, pin_memory=pin)
    train_batches = Batches(train_set, bs, train=True, seed=cfg.train.seed, **shard)
    return train_batches, Batches(val_set, max(bs, MIN_VAL_BATCH), train=False, **shard)


def _plan_graphs(
    cfg: Config, info: DistInfo, amp: str, accum: int, model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[bool, Optional[str]]:
    """``train.cuda_graphs`` on this run: (graphed?, why not), the one line said on rank 0."""
    t = cfg.train
    graphed, why_not = plan_graphs(
        t.cuda_graphs,
        info.device,
        amp=amp,
        accum_steps=accum,
        world_size=info.world_size,
        compile=t.compile,
        model=model,
        optimizer=optimizer,
    )
    line = announce(t.cuda_graphs, graphed, why_not, info.device, t.compile)
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
    plain or replayed as a CUDA graph, the EMA updated after it; each epoch ends in a metrics row
    (the loss summed over the processes, top-1 / top-5 of the model and its EMA in fp32 when due),
    a checkpoint (with each process's RNG state and partial loss sums, so a resume mid-epoch is
    bit-exact), best.pth / best_ema.pth, ``metrics.csv`` and ``curves.png``. One task per run:
    it holds the run's :class:`~inline_attn.train.state.TrainState` (epoch, step in epoch, EMA).
    """

    kind = "classification"
    config = Config

    def check(self, cfg: Config, info: DistInfo) -> None:
        """The recipe: a total batch these processes cannot reach fails here."""
        self.recipe = resolve(cfg, info.world_size)

    def setup(self, run: Run) -> None:
        cfg, info = run.cfg, run.info
        # model init is identical on every rank (DDP also broadcasts); augmentation differs per rank
        _seed_everything(cfg.train.seed)
        self.model_cfg = get_model_config(cfg.model.name)
        data = data_info(cfg.data, self.model_cfg)
        check_model_args(cfg, data)
        train_set, val_set, self.data = build_datasets(cfg.data, data, aug=cfg.aug, seed=cfg.train.seed)
        if cfg.data.on_device:  # gathered on the device: no host copy a step (the GPU preset, issue 25)
            train_set, val_set = train_set.to(run.device), val_set.to(run.device)
        run.train_set, run.val_set = train_set, val_set
        model = build_model(cfg, self.data).to(run.device)
        self.train_batches, self.val_batches = _batches(cfg, train_set, val_set, info)
        self.accum = self.recipe.accum_steps
        self.steps_per_epoch = len(self.train_batches) // self.accum
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"an epoch has {len(self.train_batches)} batches, fewer than optim.accum_steps={self.accum}"
            )
        self.state = st = _new_state(cfg, model, self.recipe, self.steps_per_epoch, run.amp)
        run.model, run.optimizer, run.sched, run.scaler, run.history = (
            st.model,
            st.optimizer,
            st.sched,
            st.scaler,
            st.history,
        )
        self.total_epochs = cfg.sched.epochs + cfg.sched.cooldown_epochs
        spe = self.steps_per_epoch
        run.cadence = EpochCadence(self.total_epochs * spe, spe, spe, spe, cfg.train.max_steps)
        self.row, self.last_path, self.graphs, self.tb = None, None, None, None
        if info.is_main:
            print(f"recipe: {self.recipe.describe()}", file=sys.stderr, flush=True)

    def load_checkpoint(self, path) -> dict:
        return ckpt_io.load(path)

    def seed_rank(self, cfg: Config, rank: int) -> None:
        _seed_everything(cfg.train.seed + SEED_STRIDE * rank)

    def restore(self, run: Run, path: pathlib.Path, ckpt: dict) -> None:
        """The state, this rank's RNG and partial sums from ``ckpt`` (checked to fit this run)."""
        st, info = self.state, run.info
        ranks = ckpt_io.restore(
            st, ckpt, path, run.cfg, world_size=info.world_size, steps_per_epoch=self.steps_per_epoch
        )
        if ranks is not None:
            set_rng_state(ranks[info.rank]["rng"])
            st.partial = ranks[info.rank]["partial"].clone()
        run.step, run.history, run.elapsed = st.step, st.history, st.elapsed_s

    def wrap(self, run: Run) -> nn.Module:
        """channels_last, DDP, CUDA graphs or torch.compile as configured; the augmentation."""
        cfg, info = run.cfg, run.info
        if cfg.train.channels_last:
            run.model = self.state.model = run.model.to(memory_format=torch.channels_last)
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
        it), from the state's epoch and step in it on."""
        st = self.state
        while True:
            it = self.train_batches.iterate(st.epoch, st.step_in_epoch * self.accum)
            self.t_epoch, self.seen = time.time(), 0
            for _ in range(st.step_in_epoch, self.steps_per_epoch):
                yield it

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
        st = self.state
        step_loss = self._graphed_step(run, model, it) if self.graphs is not None else self._plain_step(run, model, it)
        st.step += 1
        st.step_in_epoch += 1
        st.partial += step_loss
        self.seen += int(step_loss[1])
        return {"loss": step_loss[0] / step_loss[1]}, int(step_loss[1])

    def _plain_step(self, run: Run, model: nn.Module, it) -> torch.Tensor:
        """[loss sum, samples] of one step: ``accum`` micro-batches, DDP syncing on the last."""
        st = self.state
        st.optimizer.zero_grad(set_to_none=True)
        step_loss = torch.zeros(2, dtype=torch.float64)
        for m in range(self.accum):
            x, target, y = self._batch(run, it)
            sync = m == self.accum - 1 or not run.info.enabled
            with contextlib.nullcontext() if sync else model.no_sync():
                with autocast(run.device, run.amp):
                    logits = model(x)
                loss = soft_cross_entropy(logits, target)
                check_finite(loss, f"epoch {st.epoch}, step {st.step}")
                backward(loss / self.accum, st.scaler)
            step_loss += torch.tensor([loss.item() * y.numel(), y.numel()], dtype=torch.float64)
        optimizer_step(st.model.parameters(), st.optimizer, st.scaler, run.cfg.optim.clip_grad)
        st.sched.step()
        if st.ema is not None:
            st.ema.update(st.model)
        return step_loss

    def _graphed_step(self, run: Run, model: nn.Module, it) -> torch.Tensor:
        """:meth:`_plain_step` through :attr:`graphs` (one micro-batch, no scaler): the step with its
        EMA update replayed, the loss read after it, then the schedule written into the tensor lr."""
        st = self.state
        x, target, y = self._batch(run, it)
        loss = self.graphs.train_step(st, model, soft_cross_entropy, x, target)
        check_finite(loss, f"epoch {st.epoch}, step {st.step}")
        step_loss = torch.tensor([loss.item() * y.numel(), y.numel()], dtype=torch.float64)
        st.sched.step()
        return step_loss

    def record(self, run: Run, window, losses: dict, pbar) -> None:
        """The end of an epoch: its loss reduced over the processes, evaluation when due; the
        history row and its line (the files follow in :meth:`saved`, after the epoch's checkpoint)."""
        st, info = self.state, run.info
        epoch_time = time.time() - self.t_epoch
        sums = all_reduce_sum(st.partial.clone(), info)
        row = {
            "epoch": st.epoch,
            "step": st.step,
            "lr": st.lr,
            "train_loss": sums[0].item() / max(sums[1].item(), 1),
            "epoch_time_s": round(epoch_time, 2),
            "train_img_s": round(self.seen * info.world_size / max(epoch_time, 1e-9), 1),
        }
        if (st.epoch + 1) % run.cfg.train.eval_every == 0 or st.epoch + 1 == self.total_epochs:
            row.update(self._evaluate(run))
        st.history.append(row)
        st.epoch, st.step_in_epoch = st.epoch + 1, 0
        st.partial.zero_()
        self.row = row
        if info.is_main:
            pbar.write(_epoch_line(row, self.total_epochs), file=sys.stderr)

    def _evaluate(self, run: Run) -> dict:
        """val_loss / val_top1 / val_top5 (and val_top1_ema), in fp32 whatever the training
        precision (the authors' validate())."""
        st, info, graphs = self.state, run.info, self.graphs
        forward = graphs.eval_forward(st.model) if graphs is not None else None
        ev = evaluate(st.model, self.val_batches, self.eval_tf, info.device, info, "none", forward)
        out = dict(val_loss=ev["loss"], val_top1=ev["top1"], val_top5=ev["top5"])
        if ev["n_unreadable"] and info.is_main:
            log.warning("validation: %d images scored, %d unreadable skipped", ev["n"], ev["n_unreadable"])
        if st.ema is not None:
            forward = graphs.eval_forward(st.ema.module) if graphs is not None else None
            ema = evaluate(st.ema.module, self.val_batches, self.eval_tf, info.device, info, "none", forward)
            out["val_top1_ema"] = ema["top1"]
        return out

    def rank_state(self, run: Run) -> dict:
        return {"rng": rng_state(), "partial": self.state.partial.clone()}

    def checkpoint(self, run: Run, ranks: list) -> dict:
        extra = {
            "model_name": run.cfg.model.name,
            "model_kwargs": model_kwargs(run.cfg, self.data),
            "pretrained_cfg": self.model_cfg.to_dict(),
        }
        return ckpt_io.state_dict(
            self.state,
            run.cfg,
            rank_states=ranks,
            world_size=run.info.world_size,
            steps_per_epoch=self.steps_per_epoch,
            extra=extra,
            t_start=run.t_start,
        )

    def saved(self, run: Run, path: pathlib.Path) -> None:
        """At an epoch's end: best.pth / best_ema.pth, metrics.csv, TensorBoard, curves.png."""
        self.last_path = path
        if self.row is None:
            return
        row, self.row, history = self.row, None, self.state.history
        keep_best(run.out, history, path)
        write_metrics(history, run.out / "metrics.csv")
        self.tb.log(row)
        plot_curves(history, run.out / "curves.png", title=run.cfg.model.name)

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
        st, info, history = self.state, run.info, self.state.history
        ckpt_path = self.last_path if stopped else run.out / LAST
        summary = {
            "model": run.cfg.model.name,
            "model_kwargs": run.cfg.model.kwargs,
            "params": run.n_params,
            "epochs_done": len(history),
            "steps": st.step,
            "world_size": info.world_size,
            "rank": info.rank,
            "device": str(info.device),
            "stopped": stopped,
            "signal": signum if stopped == "signal" else None,
            "checkpoint": str(ckpt_path) if ckpt_path else None,
            "output": str(run.out),
            "recipe": self.recipe.to_dict(),
            "cuda_graphs": self.graphs_summary(run.cfg),
        }
        if history:
            summary.update(self._results(run.out, history))
        if stopped is None:
            summary["train_time_s"] = round(st.elapsed_s + time.time() - run.t_start, 1)
            if info.is_main:
                self._write_summary(run, summary)
        elif info.is_main:
            how = (
                "run the same command again"
                if run.cfg.train.resume == "auto"
                else "run the same command with --resume auto"
            )
            print(
                f"stopped ({stopped}) at step {st.step}; checkpoint {ckpt_path}; {how} to continue",
                file=sys.stderr,
                flush=True,
            )
        return summary

    def _results(self, out: pathlib.Path, history: list[dict]) -> dict:
        """The last epoch's numbers, the median throughput and the best epochs."""
        last = history[-1]
        res = {
            "final": {k: last.get(k) for k in ("train_loss", "val_loss", "val_top1", "val_top5", "val_top1_ema")},
            "train_img_s": round(float(np.median([r["train_img_s"] for r in history])), 1),
        }
        for key, tag, name in (("val_top1", "", ckpt_io.BEST), ("val_top1_ema", "_ema", ckpt_io.BEST_EMA)):
            best = _best(history, key)
            if best is not None:
                res[f"best_val_top1{tag}"] = best["value"]
                res[f"best{tag}_epoch"] = best["epoch"]
                res[f"best{tag}_checkpoint"] = str(out / name)
        return res

    def _write_summary(self, run: Run, summary: dict) -> None:
        d = self.data
        try:
            summary["macs"] = profile(self.state.model, (d.in_chans, d.img_size, d.img_size)).macs
        except Exception as e:  # counting is a report, never a reason to fail a finished run
            log.warning("MAC count failed: %s", e)
        summary["curves"] = str(run.out / "curves.png")
        write_json(summary, run.out / "summary.json")

    def close(self, run: Run) -> None:
        if self.tb is not None:
            self.tb.close()
