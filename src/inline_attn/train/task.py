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

import functools
import logging
import pathlib
import sys
from typing import Iterator, Optional

import numpy as np
import torch
import torch.nn as nn

from ..data import DataInfo, EvalTransform, check_class_count, Mixup, TrainAugment
from ..models import create_model, get_model_config
from ..models.profile import profile
from ..runtime.amp import autocast
from ..runtime.distributed import DistInfo
from ..models.timm_contract import layer_ids
from ..runtime.optim import CosineSchedule, build_optimizer, check_no_weight_decay
from ..runtime.run import Run
from ..runtime.task import EpochCadence, MicroBatches, Task
from ..runtime.run import train as run_task
from .config import Config
from .data import Batches, build_datasets, data_info, loader_crops
from .finetune import load_initial_weights
from .evaluate import evaluate, soft_cross_entropy
from .recipe import Recipe, resolve
from .report import METRIC_COLUMNS, plot_curves

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
    """Build the model on the meta device (no memory, no time) so a bad model.kwargs, or an
    optim.no_weight_decay entry naming none of its parameters, fails before the data is read; the
    class count is a stand-in when the data has not given it yet."""
    kwargs = {
        "drop_path_rate": cfg.model.drop_path,
        "drop_rate": cfg.model.drop,
        **model_kwargs(cfg, data.with_classes(data.num_classes or 1)),
    }
    try:
        with torch.device("meta"):
            model = create_model(cfg.model.name, **kwargs)
    except (TypeError, ValueError) as e:
        raise ValueError(f"model.name={cfg.model.name!r} with model.kwargs={cfg.model.kwargs}: {e}") from e
    if cfg.optim.no_weight_decay is not None:
        check_no_weight_decay(model, cfg.optim.no_weight_decay)


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


def optimizer_for(cfg: Config, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """The config's optimizer over ``model`` at ``lr``, with layer-wise lr decay when
    ``optim.layer_decay`` is set (the layers of the model's ``group_matcher``)."""
    o = cfg.optim
    layers = None if o.layer_decay is None else layer_ids(model)
    return build_optimizer(model, o.opt, lr, o.weight_decay, o.betas, o.eps, o.no_weight_decay, (o.layer_decay, layers))


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


def _epoch_line(row: dict) -> str:
    msg = f"train_loss {row['train_loss']:.4f}  lr {row['lr']:.2e}  {row['train_img_s']:.0f} img/s"
    if row.get("val_top1") is not None:
        msg += f"  val_top1 {row['val_top1']:.2f}  val_top5 {row['val_top5']:.2f}"
    if row.get("val_top1_ema") is not None:
        msg += f"  ema_top1 {row['val_top1_ema']:.2f}"
    return msg


class ClassifyTask(Task):
    """Image classification on the one run (:class:`~inline_attn.runtime.run.Run`), in epochs.

    A step is one optimizer step over ``accum`` micro-batches, each augmented on the device and
    mixed as the run takes it; each epoch ends in a metrics row (the loss per image over the
    processes, top-1 / top-5 of the model and its EMA in fp32 when due), a checkpoint,
    best.pth / best_ema.pth (the best ``val_top1``) and ``curves.png``. Where the epoch stands
    follows from the run's step (``steps_per_epoch`` in every checkpoint).
    """

    kind = "classification"
    config = Config
    checkpoint_keys = ("epoch", "step_in_epoch")
    csv_columns = METRIC_COLUMNS
    loss_keys = ("train_loss",)
    metric_keys = ("val_loss", "val_top1", "val_top5")
    throughput_key, window_key, best_key = "train_img_s", "epoch_time_s", "val_top1"
    criterion = staticmethod(soft_cross_entropy)
    picture_each_row = True

    def datasets(self, cfg: Config, info: DistInfo, progress: bool):
        """The data (checked against the model first), its batches (this process's share), the
        recipe and the augmentation on the device."""
        self.recipe, self.device, self.is_main = resolve(cfg, info.world_size), info.device, info.is_main
        self.channels_last = cfg.train.channels_last
        self.model_cfg = get_model_config(cfg.model.name)
        data = data_info(cfg.data, self.model_cfg)
        check_model_args(cfg, data)
        train_set, val_set, d = build_datasets(cfg.data, data, aug=cfg.aug, seed=cfg.train.seed)
        if "num_classes" in cfg.model.kwargs:  # a head of another size fails in the loss, or scores nothing
            check_class_count(
                cfg.model.kwargs["num_classes"], d.num_classes, model="model.kwargs.num_classes", data="the data"
            )
        if cfg.data.on_device:  # gathered on the device: no host copy a step (the GPU preset)
            train_set, val_set = train_set.to(info.device), val_set.to(info.device)
        self.train_batches, self.val_batches = _batches(cfg, train_set, val_set, info)
        self.accum, self.data, a = self.recipe.accum_steps, d, cfg.aug
        self.steps_per_epoch = len(self.train_batches) // self.accum
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"an epoch has {len(self.train_batches)} batches, fewer than optim.accum_steps={self.accum}"
            )
        self.train_aug = _train_augment(cfg, d).to(info.device)
        self.mixup = Mixup(d.num_classes, a.mixup, a.cutmix, a.mixup_prob, a.mixup_switch_prob, a.smoothing)
        self.eval_tf = EvalTransform(d.img_size, d.mean, d.std, d.crop_pct, d.interpolation, d.eval_resize)
        self.eval_tf = self.eval_tf.to(info.device)
        return train_set, val_set

    def build_model(self, cfg: Config, num_classes: int) -> nn.Module:
        return build_model(cfg, self.data)

    def optimization(self, cfg: Config, model: nn.Module) -> tuple:
        optimizer = optimizer_for(cfg, model, self.recipe.lr)
        return optimizer, build_schedule(cfg, optimizer, self.recipe, self.steps_per_epoch), self.recipe.ema_decay

    def cadence(self, cfg: Config) -> EpochCadence:
        self.total_epochs = cfg.sched.epochs + cfg.sched.cooldown_epochs
        spe = self.steps_per_epoch
        if self.is_main:
            print(f"recipe: {self.recipe.describe()}", file=sys.stderr, flush=True)
        return EpochCadence(
            self.total_epochs * spe, spe, spe * cfg.train.eval_every, spe, cfg.train.max_steps, self.accum
        )

    def batches(self, train_set, cfg: Config, info: DistInfo, step: int) -> Iterator:
        """Each step's ``accum`` micro-batches from the epoch's iterator, from step ``step`` on."""
        epoch, first = divmod(step, self.steps_per_epoch)
        while True:
            it = self.train_batches.iterate(epoch, first * self.accum)
            for _ in range(first, self.steps_per_epoch):
                yield MicroBatches(self.accum, functools.partial(self._batch, it))
            epoch, first = epoch + 1, 0

    def _batch(self, it) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next batch on the device, augmented and mixed: (images, soft targets, labels)."""
        x, y = next(it)
        x = self.train_aug(x.to(self.device, non_blocking=True))
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        x, target = self.mixup(x, y.to(self.device, non_blocking=True))
        return x, target, y

    def losses(self, model: nn.Module, batch, norm: nn.Module, device: torch.device, amp: str) -> tuple[dict, int]:
        """The soft-target cross-entropy of ``batch`` (images, soft targets, labels), and its size."""
        x, target, y = batch
        with autocast(device, amp):
            logits = model(x)
        return {"train_loss": soft_cross_entropy(logits, target)}, y.numel()

    def evaluate(self, model, val_set, cfg, device, info, amp, progress, forward=None) -> dict:
        """val_loss / val_top1 / val_top5, in fp32 whatever the training precision (the authors'
        validate())."""
        ev = evaluate(model, self.val_batches, self.eval_tf, info.device, info, "none", forward)
        if ev["n_unreadable"] and info.is_main:
            log.warning("validation: %d images scored, %d unreadable skipped", ev["n"], ev["n_unreadable"])
        return dict(val_loss=ev["loss"], val_top1=ev["top1"], val_top5=ev["top5"])

    def eval_line(self, row: dict) -> str:
        return _epoch_line(row)

    def extra_state(self, run: Run) -> dict:
        """Where the epoch stands, and what evaluation needs to rebuild the model."""
        return {
            "epoch": run.step // self.steps_per_epoch,
            "step_in_epoch": run.step % self.steps_per_epoch,
            "steps_per_epoch": self.steps_per_epoch,
            "model_name": run.cfg.model.name,
            "model_kwargs": model_kwargs(run.cfg, self.data),
            "pretrained_cfg": self.model_cfg.to_dict(),
        }

    def load_extra_state(self, run: Run, where: str, state: dict) -> None:
        """An epoch of the checkpoint must have as many steps as one of this run."""
        saved_steps = state.get("steps_per_epoch")
        if saved_steps is not None and int(saved_steps) != self.steps_per_epoch:
            raise ValueError(
                f"cannot resume from {where}: an epoch had {saved_steps} steps, now {self.steps_per_epoch} "
                "(the training data changed); start a new run (another train.output, or train.overwrite)"
            )

    def picture(self, model, val_set, cfg, device, out: pathlib.Path, step: int, history: list, last_eval) -> tuple:
        """The training curves so far (loss and top-1 per epoch)."""
        plot_curves(history, out / "curves.png", title=cfg.model.name)
        return "curves", out / "curves.png"

    def headline(self, cfg: Config) -> dict:
        return {"model": cfg.model.name, "model_kwargs": cfg.model.kwargs, "recipe": self.recipe.to_dict()}

    def summary(self, cfg: Config, model: nn.Module, history: list, last_eval: Optional[dict], classes: list) -> dict:
        """The epochs done, the last epoch's numbers, the median throughput, the best epochs, MACs."""
        res: dict = {"epochs_done": len(history)}
        if history:
            last = history[-1]
            res["final"] = {k: last.get(k) for k in ("train_loss", "val_loss", "val_top1", "val_top5", "val_top1_ema")}
            res["train_img_s"] = round(float(np.median([r["train_img_s"] for r in history])), 1)
        for key, tag in (("val_top1", ""), ("val_top1_ema", "_ema")):
            best = _best(history, key)
            if best is not None:
                res[f"best_val_top1{tag}"] = best["value"]
                res[f"best{tag}_epoch"] = best["epoch"]
        try:
            res["macs"] = profile(model, (self.data.in_chans, self.data.img_size, self.data.img_size)).macs
        except Exception as e:  # counting is a report, never a reason to fail a finished run
            log.warning("MAC count failed: %s", e)
        return res
