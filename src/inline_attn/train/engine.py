"""The training and evaluation engine: one process or many (DDP), resumable, interruptible.

``train(cfg)`` runs the paper's recipe (AdamW, cosine with warm-up/cool-down, lr scaled by total
batch / 512, clipping, drop path, EMA, accumulation, mixed precision, mixup/cutmix with label
smoothing, kornia augmentation on the training device) and writes, from rank 0 only:
``config.yaml``, ``last.pth``, ``metrics.csv``, ``curves.png``, ``summary.json`` (and
TensorBoard events when tensorboard is installed) into ``train.output``.
"""
from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import random
import signal
import sys
import time
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..data import EvalTransform, Mixup, TrainAugment
from ..models import create_model, get_model_config
from . import checkpoint as ckpt_io
from .config import save_config
from .data import Batches, DataInfo, build_datasets, resolve_data_info
from .distributed import DistInfo, all_reduce, all_reduce_sum, barrier, cleanup, init_distributed
from .ema import ModelEma
from ..models.profile import count_params, profile
from .optim import CosineSchedule, build_optimizer
from .report import TensorBoard, plot_curves, write_json, write_metrics

log = logging.getLogger(__name__)


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """logits: [B, K], target: [B, K] probabilities -> mean over the batch of -sum t log p."""
    return torch.sum(-target * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()


def accuracy_counts(logits: torch.Tensor, target: torch.Tensor, topk=(1, 5)) -> list[int]:
    """Number of samples whose label is among the top-k logits, for each k (k capped at K)."""
    maxk = min(max(topk), logits.shape[-1])
    pred = logits.topk(maxk, dim=-1).indices  # [B, maxk]
    hit = pred.eq(target.view(-1, 1))
    return [int(hit[:, :min(k, maxk)].any(dim=1).sum()) for k in topk]


def autocast(device: torch.device, amp: str):
    if amp in (None, "none", False):
        return contextlib.nullcontext()
    if amp == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if amp == "fp16":
        if device.type != "cuda":
            raise ValueError("train.amp=fp16 needs CUDA; use bf16 on CPU")
        return torch.autocast("cuda", dtype=torch.float16)
    raise ValueError(f"train.amp={amp!r}: expected auto, none, bf16 or fp16")


@torch.no_grad()
def evaluate(model: nn.Module, batches: Batches, transform: nn.Module, device: torch.device,
             info: Optional[DistInfo] = None, amp: str = "none") -> dict:
    """Top-1 / top-5 accuracy (%) and mean cross-entropy over every sample, summed across ranks."""
    info = info or DistInfo()
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64)  # loss sum, top1, top5, n
    for x, y in batches.iterate():
        x = transform(x.to(device, non_blocking=True))
        y = y.to(device)
        with autocast(device, amp):
            logits = model(x)
        logits = logits.float()
        t1, t5 = accuracy_counts(logits, y)
        sums += torch.tensor([float(F.cross_entropy(logits, y, reduction="sum")), t1, t5, y.numel()],
                             dtype=torch.float64)
    model.train(was_training)
    all_reduce_sum(sums, info)
    n = max(sums[3].item(), 1.0)
    return {"loss": sums[0].item() / n, "top1": 100.0 * sums[1].item() / n, "top5": 100.0 * sums[2].item() / n,
            "n": int(sums[3].item())}


def build_model(cfg: dict, data: DataInfo) -> nn.Module:
    """create_model with the config's overrides (num_classes/in_chans/img_size from the data)."""
    m = cfg["model"]
    kwargs = {"drop_path_rate": m["drop_path"], "drop_rate": m["drop"], **_model_kwargs(cfg, data)}
    try:
        model = create_model(m["name"], **kwargs)
    except TypeError as e:  # an override the constructor does not take
        raise ValueError(f"model {m['name']!r} rejected its arguments {kwargs}: {e}") from e
    if m["checkpoint"]:
        sd = ckpt_io.model_state_dict(ckpt_io.load(m["checkpoint"]))
        own = model.state_dict()
        sd = {k: v for k, v in sd.items() if k in own and own[k].shape == v.shape}  # drop a mismatched head
        missing, _ = model.load_state_dict(sd, strict=False)
        log.info("initialised from %s (%d tensors not loaded: %s)", m["checkpoint"], len(missing), missing[:5])
    return model


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class _StopFlag:
    """Set by SIGINT/SIGTERM: the loop saves a checkpoint at the next step boundary and returns."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._old = {}

    def install(self) -> None:
        if not hasattr(signal, "SIGTERM"):
            return
        try:
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        except ValueError:  # not the main thread: no handlers
            self._old = {}

    def _handle(self, signum, frame):
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.signum = signum

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}


def train(cfg: dict, *, rank: Optional[int] = None, world_size: Optional[int] = None,
          init_method: Optional[str] = None) -> dict:
    """Train with ``cfg`` (see :mod:`inline_attn.train.config`); returns the summary dict.

    ``rank``/``world_size``/``init_method`` join a process group explicitly (tests); under
    torchrun they come from the environment.
    """
    t_cfg = cfg["train"]
    threads = torch.get_num_threads()
    if t_cfg["threads"]:
        torch.set_num_threads(int(t_cfg["threads"]))
    info = init_distributed(t_cfg["device"], rank=rank, world_size=world_size, init_method=init_method)
    # deterministic mode is process-global: put it back afterwards (tests share one process)
    det = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        return _train(cfg, info)
    finally:
        torch.use_deterministic_algorithms(det[0], warn_only=det[1])
        torch.set_num_threads(threads)
        cleanup(info)


def _train(cfg: dict, info: DistInfo) -> dict:
    t_cfg, o_cfg, s_cfg, a_cfg = cfg["train"], cfg["optim"], cfg["sched"], cfg["aug"]
    device = info.device
    out = pathlib.Path(t_cfg["output"])
    if t_cfg["deterministic"]:
        torch.use_deterministic_algorithms(True, warn_only=True)
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = False
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # model init is identical on every rank (DDP also broadcasts); augmentation differs per rank
    _seed_everything(int(t_cfg["seed"]))
    model_cfg = get_model_config(cfg["model"]["name"])
    data = resolve_data_info(cfg, model_cfg)
    train_set, val_set = build_datasets(cfg, data)
    model = build_model(cfg, data).to(device)
    n_params = count_params(model)
    accum = int(o_cfg["accum_steps"])
    if accum < 1:
        raise ValueError(f"optim.accum_steps={accum} must be >= 1")
    bs = int(cfg["data"]["batch_size"])
    total_batch = bs * info.world_size * accum
    lr = o_cfg["lr"] if o_cfg["lr"] is not None else o_cfg["base_lr"] * total_batch / 512
    pin = device.type == "cuda"
    train_batches = Batches(train_set, bs, rank=info.rank, world_size=info.world_size, train=True,
                            seed=int(t_cfg["seed"]), workers=int(cfg["data"]["workers"]), pin_memory=pin)
    val_batches = Batches(val_set, max(bs, 64), rank=info.rank, world_size=info.world_size, train=False,
                          workers=int(cfg["data"]["workers"]), pin_memory=pin)
    micro_per_epoch = len(train_batches)
    steps_per_epoch = micro_per_epoch // accum
    if steps_per_epoch < 1:
        raise ValueError(f"an epoch has {micro_per_epoch} batches, fewer than optim.accum_steps={accum}")
    optimizer = build_optimizer(model, o_cfg["opt"], lr, o_cfg["weight_decay"], o_cfg["betas"], o_cfg["eps"])
    epochs = int(s_cfg["epochs"])
    total_epochs = epochs + int(s_cfg["cooldown_epochs"])
    sched = CosineSchedule(optimizer, lr=lr, steps_per_epoch=steps_per_epoch, epochs=epochs,
                           warmup_epochs=s_cfg["warmup_epochs"], cooldown_epochs=s_cfg["cooldown_epochs"],
                           warmup_lr=s_cfg["warmup_lr"], min_lr=s_cfg["min_lr"])
    amp = t_cfg["amp"] or "none"
    if amp == "auto":  # the authors' --amp on GPUs; full precision on CPU
        amp = "fp16" if device.type == "cuda" else "none"
    autocast(device, amp)  # validates the setting before any work
    scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None
    ema = ModelEma(model, t_cfg["ema_decay"]) if t_cfg["ema"] else None
    train_aug = TrainAugment(
        data.img_size, data.mean, data.std, crop=a_cfg["crop"], scale=a_cfg["scale"], ratio=a_cfg["ratio"],
        padding=a_cfg["padding"], hflip=a_cfg["hflip"], auto_augment=a_cfg["auto_augment"],
        color_jitter=a_cfg["color_jitter"], re_prob=a_cfg["re_prob"], interpolation=data.interpolation).to(device)
    eval_tf = EvalTransform(data.img_size, data.mean, data.std, data.crop_pct, data.interpolation).to(device)
    mixup = Mixup(data.num_classes, a_cfg["mixup"], a_cfg["cutmix"], a_cfg["mixup_prob"],
                  a_cfg["mixup_switch_prob"], a_cfg["smoothing"])

    # ---- resume
    start_epoch, skip, step = 0, 0, 0
    history: list[dict] = []
    partial = torch.zeros(2, dtype=torch.float64)  # this epoch so far: loss sum, samples (this rank)
    elapsed = 0.0
    resume = t_cfg["resume"]
    resume_path = ckpt_io.find_resume(out) if resume == "auto" else (pathlib.Path(resume) if resume else None)
    rng_restore = None
    if resume_path is not None:
        state = ckpt_io.load(resume_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        if ema is not None and state.get("model_ema"):
            ema.module.load_state_dict(state["model_ema"])
        start_epoch, skip, step = state["epoch"], state["step_in_epoch"], state["step"]
        history = state.get("history", [])
        elapsed = state.get("elapsed_s", 0.0)
        ranks = state.get("rank_states", [])
        if len(ranks) == info.world_size:
            rng_restore = ranks[info.rank]["rng"]
            partial = ranks[info.rank]["partial"].clone()
        if info.is_main:
            log.info("resumed from %s at epoch %d, step %d", resume_path, start_epoch, step)
    if rng_restore is not None:
        ckpt_io.set_rng_state(rng_restore)
    elif resume_path is None:
        _seed_everything(int(t_cfg["seed"]) + 1000003 * info.rank)

    if t_cfg["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    ddp_model = model
    if info.enabled:
        ddp_model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    if t_cfg["compile"]:  # the fused InLine op stays one node of the graph (a custom op)
        ddp_model = torch.compile(ddp_model)

    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.yaml")
    tb = TensorBoard(out / "tb" if (info.is_main and t_cfg["tensorboard"]) else None)

    def save(epoch: int, step_in_epoch: int, part: torch.Tensor) -> Optional[pathlib.Path]:
        rank_state = {"rng": ckpt_io.rng_state(), "partial": part.clone()}
        if info.enabled:
            gathered = [None] * info.world_size
            dist.all_gather_object(gathered, rank_state)
        else:
            gathered = [rank_state]
        if not info.is_main:
            return None
        state = {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": sched.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "model_ema": ema.module.state_dict() if ema is not None else None,
            "epoch": epoch, "step_in_epoch": step_in_epoch, "step": step, "history": history,
            "rank_states": gathered, "config": cfg, "elapsed_s": elapsed + (time.time() - t_start),
            "world_size": info.world_size, "model_name": cfg["model"]["name"],
            "model_kwargs": model_kwargs, "pretrained_cfg": model_cfg.to_dict(),
        }
        return ckpt_io.atomic_save(state, out / ckpt_io.LAST)

    model_kwargs = _model_kwargs(cfg, data)
    stop = _StopFlag()
    stop.install()
    max_steps = int(t_cfg["max_steps"] or 0)
    interrupted = None
    t_start = time.time()
    show = info.is_main and t_cfg["progress"]
    try:
        for epoch in range(start_epoch, total_epochs):
            ddp_model.train()
            t_epoch = time.time()
            seen = 0
            pbar = None
            if show:
                from tqdm import tqdm

                pbar = tqdm(total=steps_per_epoch, initial=skip, desc=f"epoch {epoch + 1}/{total_epochs}",
                            dynamic_ncols=True, mininterval=1.0, file=sys.stderr, leave=False)
            it = train_batches.iterate(epoch, skip * accum)
            for s in range(skip, steps_per_epoch):
                t_step = time.time()
                optimizer.zero_grad(set_to_none=True)
                step_loss = torch.zeros(2, dtype=torch.float64)
                for m in range(accum):
                    x, y = next(it)
                    x = train_aug(x.to(device, non_blocking=True))
                    if t_cfg["channels_last"]:
                        x = x.contiguous(memory_format=torch.channels_last)
                    y = y.to(device, non_blocking=True)
                    x, target = mixup(x, y)
                    sync = m == accum - 1 or not info.enabled
                    ctx = contextlib.nullcontext() if sync else ddp_model.no_sync()
                    with ctx:
                        with autocast(device, amp):
                            logits = ddp_model(x)
                        loss = soft_cross_entropy(logits, target)
                        if not torch.isfinite(loss):
                            raise FloatingPointError(f"loss is {loss.item()} at epoch {epoch}, step {step}")
                        scaled = loss / accum
                        (scaler.scale(scaled) if scaler is not None else scaled).backward()
                    step_loss += torch.tensor([loss.item() * y.numel(), y.numel()], dtype=torch.float64)
                if scaler is not None:
                    scaler.unscale_(optimizer)
                if o_cfg["clip_grad"]:
                    nn.utils.clip_grad_norm_(model.parameters(), float(o_cfg["clip_grad"]))
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                sched.step()
                if ema is not None:
                    ema.update(model)
                step += 1
                partial += step_loss
                seen += int(step_loss[1])
                if pbar is not None:
                    ips = step_loss[1].item() * info.world_size / max(time.time() - t_step, 1e-9)
                    pbar.set_postfix(loss=f"{step_loss[0].item() / step_loss[1].item():.4f}",
                                     lr=f"{optimizer.param_groups[0]['lr']:.2e}", img_s=f"{ips:.0f}", refresh=False)
                    pbar.update(1)
                # every rank stops at the same step (torchrun signals each worker separately)
                want = all_reduce(torch.tensor([1.0 if stop.signum is not None else 0.0]), info, dist.ReduceOp.MAX)
                if want.item() > 0 or (max_steps and step >= max_steps):
                    interrupted = "signal" if want.item() > 0 else "max_steps"
                    if s + 1 < steps_per_epoch:
                        path = save(epoch, s + 1, partial)
                        if pbar is not None:
                            pbar.close()
                        return _finish(cfg, info, out, history, interrupted, path, n_params, step, tb)
            if pbar is not None:
                pbar.close()
            skip = 0
            # ---- end of epoch: reduce, evaluate, record, checkpoint
            sums = all_reduce_sum(partial.clone(), info)
            epoch_time = time.time() - t_epoch
            row = {"epoch": epoch, "step": step, "lr": optimizer.param_groups[0]["lr"],
                   "train_loss": sums[0].item() / max(sums[1].item(), 1), "epoch_time_s": round(epoch_time, 2),
                   "train_img_s": round(seen * info.world_size / max(epoch_time, 1e-9), 1)}
            if (epoch + 1) % int(t_cfg["eval_every"]) == 0 or epoch + 1 == total_epochs:
                ev = evaluate(model, val_batches, eval_tf, device, info, amp)
                row.update(val_loss=ev["loss"], val_top1=ev["top1"], val_top5=ev["top5"])
                if ema is not None:
                    row["val_top1_ema"] = evaluate(ema.module, val_batches, eval_tf, device, info, amp)["top1"]
            history.append(row)
            partial.zero_()
            path = save(epoch + 1, 0, partial)
            if info.is_main:
                write_metrics(history, out / "metrics.csv")
                tb.log(row)
                plot_curves(history, out / "curves.png", title=cfg["model"]["name"])
                msg = (f"epoch {epoch + 1}/{total_epochs}  train_loss {row['train_loss']:.4f}  "
                       f"lr {row['lr']:.2e}  {row['train_img_s']:.0f} img/s")
                if row.get("val_top1") is not None:
                    msg += f"  val_top1 {row['val_top1']:.2f}  val_top5 {row['val_top5']:.2f}"
                if row.get("val_top1_ema") is not None:
                    msg += f"  ema_top1 {row['val_top1_ema']:.2f}"
                print(msg, file=sys.stderr, flush=True)
            if interrupted:
                return _finish(cfg, info, out, history, interrupted, path, n_params, step, tb)
        return _finish(cfg, info, out, history, None, out / ckpt_io.LAST, n_params, step, tb,
                       elapsed=elapsed + time.time() - t_start, model=model, data=data)
    finally:
        stop.restore()
        tb.close()


def _model_kwargs(cfg: dict, data: DataInfo) -> dict:
    m = cfg["model"]
    kw = {"num_classes": data.num_classes}
    if data.in_chans != 3:
        kw["in_chans"] = data.in_chans
    if cfg["data"]["img_size"] or data.img_size != get_model_config(m["name"]).input_size[-1]:
        kw["img_size"] = data.img_size
    kw.update(m["kwargs"] or {})
    return kw


def _finish(cfg, info, out, history, interrupted, ckpt_path, n_params, step, tb, elapsed=None, model=None,
            data=None) -> dict:
    summary = {
        "model": cfg["model"]["name"], "model_kwargs": cfg["model"]["kwargs"], "params": n_params,
        "epochs_done": len(history), "steps": step, "world_size": info.world_size, "rank": info.rank,
        "device": str(info.device), "interrupted": interrupted,
        "checkpoint": str(ckpt_path) if ckpt_path else None, "output": str(out),
    }
    if history:
        last = history[-1]
        evals = [r for r in history if r.get("val_top1") is not None]
        summary.update(final={k: last.get(k) for k in ("train_loss", "val_loss", "val_top1", "val_top5",
                                                       "val_top1_ema")},
                       best_val_top1=max((r["val_top1"] for r in evals), default=None),
                       train_img_s=round(float(np.median([r["train_img_s"] for r in history])), 1))
    if elapsed is not None:
        summary["train_time_s"] = round(elapsed, 1)
    if model is not None and data is not None and info.is_main:
        try:
            summary["macs"] = profile(model, (data.in_chans, data.img_size, data.img_size)).macs
        except Exception as e:  # counting is a report, never a reason to fail a finished run
            log.warning("MAC count failed: %s", e)
    if info.is_main and interrupted is None:
        summary["curves"] = str(out / "curves.png")
        write_json(summary, out / "summary.json")
    elif info.is_main:
        print(f"interrupted ({interrupted}) at step {step}; checkpoint {ckpt_path}; continue with "
              f"--train.resume auto", file=sys.stderr, flush=True)
    barrier(info)
    return summary
