"""The training entry point: one process or many (DDP), resumable, interruptible.

``train(cfg)`` runs the paper's recipe as the authors' code runs it (AdamW, timm's cosine with
warm-up/cool-down, lr, warmup_lr and min_lr scaled by total batch / 512, accumulation to a pinned
total batch, clipping, drop path, EMA with its decay scaled by the total batch, mixed precision,
mixup/cutmix with label smoothing, per-image augmentation on the training device, evaluation in
fp32) and writes, from rank 0 only: ``config.yaml``, ``last.pth`` (and ``previous.pth``),
``best.pth`` / ``best_ema.pth`` (the epochs with the best top-1), ``metrics.csv``, ``curves.png``,
``summary.json`` (and TensorBoard events when tensorboard is installed) into ``train.output``.
The steps of an epoch are :class:`~inline_attn.train.loop.EpochRunner`'s; checkpoints are
:mod:`~inline_attn.train.checkpoint`'s.
"""

from __future__ import annotations

import logging
import os
import pathlib
import random
import sys
import time
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from ..runtime.compile import compile_module
from ..runtime.graphs import compile_mode_for
from ..data import DataInfo, EvalTransform, Mixup, TrainAugment
from ..models import create_model, get_model_config
from ..models.profile import count_params, profile
from ..runtime.amp import grad_scaler, resolve_amp
from ..runtime.checkpoint import LAST, copy_atomic, rng_state, save_rotating, set_rng_state
from ..runtime.distributed import SEED_STRIDE, DistInfo, all_reduce_sum, barrier, run_session
from ..runtime.ema import ModelEma
from ..runtime.loop import StopFlag
from ..runtime.optim import CosineSchedule, build_optimizer
from ..runtime.output import claim_output
from ..runtime.report import write_json
from . import checkpoint as ckpt_io
from .config import Config
from .data import Batches, build_datasets, data_info, loader_crops
from .finetune import load_initial_weights
from .graphs import StepGraphs, announce
from .graphs import plan as plan_graphs
from .loop import EpochRunner, evaluate
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
    """Train with ``cfg`` (a :class:`~inline_attn.train.config.Config`); returns the summary dict.

    ``rank``/``world_size``/``init_method`` join a process group explicitly (tests); under
    torchrun they come from the environment. A run stopped by SIGINT/SIGTERM saves a checkpoint
    and returns a summary with ``stopped="signal"`` and ``signal`` (its number). An output
    folder holding another run is refused unless ``train.resume`` or ``train.overwrite``
    (:func:`~inline_attn.runtime.output.claim_output`).
    """
    if not isinstance(cfg, Config):
        raise ValueError(f"train() takes a Config (inline_attn.train.Config.load), got {type(cfg).__name__}")
    t = cfg.train
    with run_session(t.device, t.threads, rank=rank, world_size=world_size, init_method=init_method) as info:
        with claim_output(t.output, resume=t.resume, overwrite=t.overwrite, lock=info.is_main):
            return _train(cfg, info)


def _set_determinism(cfg: Config, device: torch.device) -> None:
    if cfg.train.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = False
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def _new_state(cfg: Config, model: nn.Module, recipe: Recipe, steps_per_epoch: int, amp: str) -> TrainState:
    o, s = cfg.optim, cfg.sched
    optimizer = build_optimizer(model, o.opt, recipe.lr, o.weight_decay, o.betas, o.eps, o.no_weight_decay)
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


def _resume_or_seed(state: TrainState, cfg: Config, info: DistInfo, out: pathlib.Path, steps_per_epoch: int) -> None:
    """Continue from ``train.resume`` (state, this rank's RNG and partial sums), else seed this rank."""
    resumed = ckpt_io.load_resume(cfg.train.resume, out)
    if resumed is None:
        _seed_everything(cfg.train.seed + SEED_STRIDE * info.rank)
        return
    path, ckpt = resumed
    rank_states = ckpt_io.restore(state, ckpt, path, cfg, world_size=info.world_size, steps_per_epoch=steps_per_epoch)
    if rank_states is not None:
        set_rng_state(rank_states[info.rank]["rng"])
        state.partial = rank_states[info.rank]["partial"].clone()
    if info.is_main:
        log.info("resumed from %s at epoch %d, step %d", path, state.epoch, state.step)


def _train(cfg: Config, info: DistInfo) -> dict:
    device, out = info.device, pathlib.Path(cfg.train.output)
    recipe = resolve(cfg, info.world_size)  # a total batch these processes cannot reach fails here
    _set_determinism(cfg, device)
    # model init is identical on every rank (DDP also broadcasts); augmentation differs per rank
    _seed_everything(cfg.train.seed)
    model_cfg = get_model_config(cfg.model.name)
    data = data_info(cfg.data, model_cfg)
    check_model_args(cfg, data)
    train_set, val_set, data = build_datasets(cfg.data, data, aug=cfg.aug, seed=cfg.train.seed)
    if cfg.data.on_device:  # gathered on the device: no host copy a step (the GPU preset, issue 25)
        train_set, val_set = train_set.to(device), val_set.to(device)
    model = build_model(cfg, data).to(device)
    amp = resolve_amp(cfg.train.amp, device)
    bs, accum, workers = cfg.data.batch_size, recipe.accum_steps, cfg.data.workers
    pin = device.type == "cuda"
    train_batches = Batches(
        train_set,
        bs,
        rank=info.rank,
        world_size=info.world_size,
        train=True,
        seed=cfg.train.seed,
        workers=workers,
        pin_memory=pin,
    )
    val_batches = Batches(
        val_set,
        max(bs, MIN_VAL_BATCH),
        rank=info.rank,
        world_size=info.world_size,
        train=False,
        workers=workers,
        pin_memory=pin,
    )
    steps_per_epoch = len(train_batches) // accum
    if steps_per_epoch < 1:
        raise ValueError(f"an epoch has {len(train_batches)} batches, fewer than optim.accum_steps={accum}")
    state = _new_state(cfg, model, recipe, steps_per_epoch, amp)
    if info.is_main:
        print(f"recipe: {recipe.describe()}", file=sys.stderr, flush=True)
    _resume_or_seed(state, cfg, info, out, steps_per_epoch)
    if cfg.train.channels_last:
        model = model.to(memory_format=torch.channels_last)
    ddp_model = model
    if info.enabled:
        ddp_model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    graphed, why_not = _plan_graphs(cfg, info, amp, accum, model, state.optimizer)
    if cfg.train.compile:  # the fused InLine op stays one node of the graph (a custom op)
        ddp_model = compile_module(ddp_model, compile_mode_for(cfg.train.compile_mode, graphed))
    graphs = StepGraphs(amp, cfg.optim.clip_grad) if graphed and not cfg.train.compile else None
    # the handlers go in before config.yaml appears (the sign that a run has started), so a signal
    # from then on always ends in a checkpoint and the 128 + signum exit
    with StopFlag() as stop:
        if info.is_main:
            out.mkdir(parents=True, exist_ok=True)
            cfg.save(out / "config.yaml")
        runner = _epoch_runner(cfg, ddp_model, train_batches, data, info, amp, accum, steps_per_epoch)
        runner.graphs = graphs
        run = _Run(
            cfg, info, out, data, model_cfg, count_params(model), steps_per_epoch, model_kwargs(cfg, data), recipe
        )
        run.graphs_why_not = why_not
        eval_tf = EvalTransform(
            data.img_size, data.mean, data.std, data.crop_pct, data.interpolation, data.eval_resize
        ).to(device)
        return run.epochs(state, runner, val_batches, eval_tf, stop)


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


def _epoch_runner(
    cfg: Config, model: nn.Module, batches: Batches, data: DataInfo, info: DistInfo, amp: str, accum: int, steps: int
) -> EpochRunner:
    """The steps of an epoch: the model to call, the on-device augmentation and mixup."""
    a = cfg.aug
    return EpochRunner(
        model=model,
        batches=batches,
        device=info.device,
        info=info,
        amp=amp,
        accum=accum,
        clip_grad=cfg.optim.clip_grad,
        steps_per_epoch=steps,
        channels_last=cfg.train.channels_last,
        total_epochs=cfg.sched.epochs + cfg.sched.cooldown_epochs,
        max_steps=cfg.train.max_steps,
        progress=cfg.train.progress,
        train_aug=TrainAugment(
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
        ).to(info.device),
        mixup=Mixup(data.num_classes, a.mixup, a.cutmix, a.mixup_prob, a.mixup_switch_prob, a.smoothing),
    )


def _best(history: list[dict], key: str) -> Optional[dict]:
    """``{"value", "epoch"}`` (epoch counted from 1) of the best ``key`` in ``history``; ties: the later."""
    best = None
    for r in history:
        if r.get(key) is not None and (best is None or r[key] >= best["value"]):
            best = {"value": r[key], "epoch": r["epoch"] + 1}
    return best


class _Run:
    """The epochs of one run: train, evaluate, record, checkpoint, and the closing summary."""

    def __init__(
        self,
        cfg: Config,
        info: DistInfo,
        out: pathlib.Path,
        data: DataInfo,
        model_cfg,
        n_params: int,
        steps_per_epoch: int,
        kwargs: dict,
        recipe: Recipe,
    ):
        self.cfg, self.info, self.out, self.data, self.model_cfg = cfg, info, out, data, model_cfg
        self.n_params, self.steps_per_epoch, self.kwargs, self.recipe = n_params, steps_per_epoch, kwargs, recipe
        self.total_epochs = cfg.sched.epochs + cfg.sched.cooldown_epochs
        self.t_start = time.time()
        self.graphs: Optional[StepGraphs] = None  # the runner's, when train.cuda_graphs captures the steps
        self.graphs_why_not: Optional[str] = None

    def epochs(
        self, state: TrainState, runner: EpochRunner, val_batches: Batches, eval_tf: nn.Module, stop: StopFlag
    ) -> dict:
        """Train until the schedule ends or ``stop`` (installed by the caller) is set."""
        self.graphs = runner.graphs
        tb = TensorBoard(self.out / "tb" if (self.info.is_main and self.cfg.train.tensorboard) else None)
        try:
            while state.epoch < self.total_epochs:
                t_epoch = time.time()
                reason, seen = runner.run(state, stop.requested)
                if state.step_in_epoch < self.steps_per_epoch:  # stopped mid-epoch
                    return self.finish(state, reason, self.save(state), stop.signum)
                row = self.end_of_epoch(state, seen, time.time() - t_epoch, val_batches, eval_tf)
                path = self.save(state)
                if self.info.is_main:
                    self.keep_best(state.history, path)
                    self.record(state, row, tb)
                if reason:
                    return self.finish(state, reason, path, stop.signum)
            return self.finish(state, None, self.out / LAST)
        finally:
            tb.close()

    def end_of_epoch(
        self, state: TrainState, seen: int, epoch_time: float, val_batches: Batches, eval_tf: nn.Module
    ) -> dict:
        """Reduce the epoch's loss, evaluate when due; the epoch's history row (state advanced)."""
        sums = all_reduce_sum(state.partial.clone(), self.info)
        row = {
            "epoch": state.epoch,
            "step": state.step,
            "lr": state.lr,
            "train_loss": sums[0].item() / max(sums[1].item(), 1),
            "epoch_time_s": round(epoch_time, 2),
            "train_img_s": round(seen * self.info.world_size / max(epoch_time, 1e-9), 1),
        }
        if (state.epoch + 1) % self.cfg.train.eval_every == 0 or state.epoch + 1 == self.total_epochs:
            # reported numbers in fp32 whatever the training precision (the authors' validate())
            graphs = self.graphs
            forward = graphs.eval_forward(state.model) if graphs is not None else None
            ev = evaluate(state.model, val_batches, eval_tf, self.info.device, self.info, "none", forward)
            row.update(val_loss=ev["loss"], val_top1=ev["top1"], val_top5=ev["top5"])
            if ev["n_unreadable"] and self.info.is_main:
                log.warning("validation: %d images scored, %d unreadable skipped", ev["n"], ev["n_unreadable"])
            if state.ema is not None:
                forward = graphs.eval_forward(state.ema.module) if graphs is not None else None
                ema = evaluate(state.ema.module, val_batches, eval_tf, self.info.device, self.info, "none", forward)
                row["val_top1_ema"] = ema["top1"]
        state.history.append(row)
        state.epoch, state.step_in_epoch = state.epoch + 1, 0
        state.partial.zero_()
        return row

    def save(self, state: TrainState) -> Optional[pathlib.Path]:
        """Checkpoint (every rank contributes its RNG and partial sums; rank 0 writes)."""
        rank_state = {"rng": rng_state(), "partial": state.partial.clone()}
        gathered = [rank_state]
        if self.info.enabled:
            gathered = [None] * self.info.world_size
            dist.all_gather_object(gathered, rank_state)
        if not self.info.is_main:
            return None
        extra = {
            "model_name": self.cfg.model.name,
            "model_kwargs": self.kwargs,
            "pretrained_cfg": self.model_cfg.to_dict(),
        }
        sd = ckpt_io.state_dict(
            state,
            self.cfg,
            rank_states=gathered,
            world_size=self.info.world_size,
            steps_per_epoch=self.steps_per_epoch,
            extra=extra,
            t_start=self.t_start,
        )
        return save_rotating(sd, self.out)

    def keep_best(self, history: list[dict], path: pathlib.Path) -> None:
        """Copy the epoch's checkpoint to best.pth / best_ema.pth when its top-1 / EMA top-1 is the
        best so far (a tie goes to the later epoch, as the authors' ``>=``)."""
        row = history[-1]
        for key, name in (("val_top1", ckpt_io.BEST), ("val_top1_ema", ckpt_io.BEST_EMA)):
            value = row.get(key)
            before = [r[key] for r in history[:-1] if r.get(key) is not None]
            if value is not None and (not before or value >= max(before)):
                copy_atomic(path, self.out / name)

    def graphs_summary(self) -> dict:
        """``train.cuda_graphs`` as it ran: the setting, whether the steps were graphed (or why not),
        and how many training / evaluation steps were replayed and run ungraphed in this process."""
        out = {"setting": self.cfg.train.cuda_graphs, "graphed": False, "why_not": self.graphs_why_not}
        if self.graphs is not None:
            counts = self.graphs.counts()
            why_not = counts.pop("train_why_not", None)
            out.update(graphed=why_not is None and counts["train_replays"] > 0, why_not=why_not, **counts)
        elif self.cfg.train.compile and self.graphs_why_not is None and self.cfg.train.cuda_graphs is not False:
            out.update(graphed=True, how="torch.compile mode reduce-overhead")
        return out

    def record(self, state: TrainState, row: dict, tb: TensorBoard) -> None:
        write_metrics(state.history, self.out / "metrics.csv")
        tb.log(row)
        plot_curves(state.history, self.out / "curves.png", title=self.cfg.model.name)
        msg = (
            f"epoch {row['epoch'] + 1}/{self.total_epochs}  train_loss {row['train_loss']:.4f}  "
            f"lr {row['lr']:.2e}  {row['train_img_s']:.0f} img/s"
        )
        if row.get("val_top1") is not None:
            msg += f"  val_top1 {row['val_top1']:.2f}  val_top5 {row['val_top5']:.2f}"
        if row.get("val_top1_ema") is not None:
            msg += f"  ema_top1 {row['val_top1_ema']:.2f}"
        print(msg, file=sys.stderr, flush=True)

    def finish(
        self,
        state: TrainState,
        stopped: Optional[str],
        ckpt_path: Optional[pathlib.Path],
        signum: Optional[int] = None,
    ) -> dict:
        info, history = self.info, state.history
        summary = {
            "model": self.cfg.model.name,
            "model_kwargs": self.cfg.model.kwargs,
            "params": self.n_params,
            "epochs_done": len(history),
            "steps": state.step,
            "world_size": info.world_size,
            "rank": info.rank,
            "device": str(info.device),
            "stopped": stopped,
            "signal": signum if stopped == "signal" else None,
            "checkpoint": str(ckpt_path) if ckpt_path else None,
            "output": str(self.out),
        }
        summary["recipe"] = self.recipe.to_dict()
        summary["cuda_graphs"] = self.graphs_summary()
        if history:
            last = history[-1]
            summary.update(
                final={k: last.get(k) for k in ("train_loss", "val_loss", "val_top1", "val_top5", "val_top1_ema")},
                train_img_s=round(float(np.median([r["train_img_s"] for r in history])), 1),
            )
            for key, tag, name in (("val_top1", "", ckpt_io.BEST), ("val_top1_ema", "_ema", ckpt_io.BEST_EMA)):
                best = _best(history, key)
                if best is not None:
                    summary[f"best_val_top1{tag}"] = best["value"]
                    summary[f"best{tag}_epoch"] = best["epoch"]
                    summary[f"best{tag}_checkpoint"] = str(self.out / name)
        if stopped is None:
            summary["train_time_s"] = round(state.elapsed_s + time.time() - self.t_start, 1)
            if info.is_main:
                try:
                    summary["macs"] = profile(
                        state.model, (self.data.in_chans, self.data.img_size, self.data.img_size)
                    ).macs
                except Exception as e:  # counting is a report, never a reason to fail a finished run
                    log.warning("MAC count failed: %s", e)
                summary["curves"] = str(self.out / "curves.png")
                write_json(summary, self.out / "summary.json")
        elif info.is_main:
            how = (
                "run the same command again"
                if self.cfg.train.resume == "auto"
                else "run the same command with --resume auto"
            )
            print(
                f"stopped ({stopped}) at step {state.step}; checkpoint {ckpt_path}; {how} to continue",
                file=sys.stderr,
                flush=True,
            )
        barrier(info)
        return summary
