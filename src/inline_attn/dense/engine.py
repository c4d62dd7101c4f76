"""Segmentation training and evaluation: iteration-based, one process or many (torchrun),
resumable, with AMP; reuses the classification engine's pieces (parameter groups, distributed
helpers, atomic checkpoints).

``train_seg(cfg)`` writes, from rank 0, into ``train.output``: ``config.yaml``, ``last.pth``
(atomically, every ``train.checkpoint_interval`` iterations and at the end), ``metrics.csv``,
``summary.json`` and ``predictions.png`` (validation images, ground truth, prediction).
"""

from __future__ import annotations

import csv
import io
import logging
import math
import pathlib
import sys
import time
from typing import Optional

import numpy as np
import torch
import torch.nn as nn

from .._io import atomic_write_text
from ..models.checkpoint import read_checkpoint, unwrap_state_dict
from ..models.profile import count_params
from ..train.checkpoint import LAST, find_resume, save_rotating
from ..train.distributed import DistInfo, all_reduce, barrier, cleanup, init_distributed
from ..train.engine import autocast
from ..train.optim import param_groups
from ..train.report import write_json
from .config import save_config
from .data import StepSampler, build_seg_datasets, collate
from .metrics import SegMetric
from .heads import resize
from .segmentor import EncoderDecoder, build_segmentor

log = logging.getLogger(__name__)

__all__ = ["PolySchedule", "build_from_config", "evaluate_seg", "load_segmentor", "predict_batches", "train_seg"]


class PolySchedule:
    """Per-iteration lr (mmcv's ``poly`` policy with linear warm-up, as in the Swin and PVT
    segmentation recipes): ``lr_t = (lr - min_lr) (1 - t / T)^power + min_lr``; during the first
    ``warmup_iters`` it is further multiplied by ``1 - (1 - t / W)(1 - warmup_ratio)``."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        lr: float,
        iters: int,
        power: float = 0.9,
        min_lr: float = 0.0,
        warmup_iters: int = 0,
        warmup_ratio: float = 1e-6,
    ):
        if iters <= 0:
            raise ValueError(f"sched.iters={iters} must be positive")
        if not 0 <= warmup_iters <= iters:
            raise ValueError(f"sched.warmup_iters={warmup_iters} must be in [0, iters={iters}]")
        self.optimizer, self.lr, self.iters, self.power = optimizer, lr, iters, power
        self.min_lr, self.warmup_iters, self.warmup_ratio = min_lr, warmup_iters, warmup_ratio
        self.step_count = 0
        self._apply()

    def lr_at(self, t: int) -> float:
        lr = (self.lr - self.min_lr) * max(0.0, 1 - t / self.iters) ** self.power + self.min_lr
        if t < self.warmup_iters:
            lr *= 1 - (1 - t / self.warmup_iters) * (1 - self.warmup_ratio)
        return lr

    def _apply(self) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = self.lr_at(self.step_count)

    def step(self) -> None:
        self.step_count += 1
        self._apply()

    def state_dict(self) -> dict:
        return {"step_count": self.step_count}

    def load_state_dict(self, state: dict) -> None:
        self.step_count = int(state["step_count"])
        self._apply()


def build_from_config(cfg: dict, num_classes: int) -> EncoderDecoder:
    """The segmentor of ``cfg["model"]`` for ``num_classes`` classes (weights from
    ``model.checkpoint`` when set; backbone from ``model.pretrained`` when set)."""
    m = cfg["model"]
    if m["num_classes"] is not None and int(m["num_classes"]) != num_classes:
        raise ValueError(f"model.num_classes={m['num_classes']} but the dataset has {num_classes} classes")
    bkw = dict(m["backbone_kwargs"] or {})
    # a checkpoint named in a config is trusted, as the classification engine's model.checkpoint
    bkw.update(
        frozen_stages=int(m["frozen_stages"]),
        norm_eval=bool(m["norm_eval"]),
        pretrained=m["pretrained"],
        weights_only=False,
    )
    if m["drop_path"] is not None:
        bkw["drop_path_rate"] = float(m["drop_path"])
    try:
        model = build_segmentor(
            m["decode"],
            m["backbone"],
            num_classes=num_classes,
            channels=m["channels"],
            neck_channels=int(m["neck_channels"]),
            aux_weight=m["aux_weight"],
            aux_channels=int(m["aux_channels"]),
            dropout=float(m["dropout"]),
            ignore_index=int(m["ignore_index"]),
            avg_non_ignore=bool(m["avg_non_ignore"]),
            backbone_kwargs=bkw,
        )
    except TypeError as e:  # a backbone_kwargs entry the model does not take
        raise ValueError(
            f"backbone {m['backbone']!r} rejected model.backbone_kwargs {m['backbone_kwargs']}: {e}"
        ) from e
    if m["checkpoint"]:
        load_weights(model, m["checkpoint"])
    return model


def load_weights(model: nn.Module, path, head_key: str = "decode_head.conv_seg.weight") -> None:
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


class _Normalize(nn.Module):
    def __init__(self, mean, std):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def _resolve_amp(amp: str, device: torch.device) -> str:
    amp = amp or "none"
    if amp == "auto":
        amp = "fp16" if device.type == "cuda" else "none"
    autocast(device, amp)  # validates
    return amp


def optimizer_step(loss: torch.Tensor, step: int, model: nn.Module, optimizer, scaler, clip_grad) -> None:
    """One update from ``loss``: a non-finite loss stops the run (naming the iteration), then
    backward (scaled under fp16), optional gradient-norm clipping of the unscaled gradients, step."""
    if not torch.isfinite(loss):
        raise FloatingPointError(f"loss is {loss.item()} at iteration {step}")
    (scaler.scale(loss) if scaler is not None else loss).backward()
    if scaler is not None:
        scaler.unscale_(optimizer)
    if clip_grad:
        nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], float(clip_grad))
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()


@torch.no_grad()
def predict_batches(
    model: EncoderDecoder,
    dataset,
    cfg: dict,
    device: torch.device,
    *,
    indices=None,
    amp: str = "none",
    progress: bool = False,
):
    """Yield (image [3, H, W] 0-255, labels [H, W], predicted labels [H, W]) for ``indices`` of an
    evaluation ``dataset`` with the config's inference mode (whole / slide, flip)."""
    from tqdm import tqdm

    e = cfg["eval"]
    norm = _Normalize(cfg["data"]["mean"], cfg["data"]["std"]).to(device)
    indices = list(range(len(dataset))) if indices is None else list(indices)
    bs = max(1, int(e["batch_size"]))
    was = model.training
    model.eval()
    try:
        for start in tqdm(
            range(0, len(indices), bs), desc="eval", disable=not progress, leave=False, file=sys.stderr, mininterval=1.0
        ):
            items = [dataset[i] for i in indices[start : start + bs]]
            same = len({tuple(it[0].shape) for it in items}) == 1 and len({tuple(it[1].shape) for it in items}) == 1
            groups = [collate(items)] if same else [collate([it]) for it in items]
            for img, lab in groups:
                x = norm(img.to(device))
                with autocast(device, amp):
                    probs = model.predict(
                        x,
                        mode=e["mode"],
                        crop=e["crop_size"],
                        stride=e["stride"],
                        out_size=lab.shape[-2:],
                        flip=bool(e["flip"]),
                    )
                pred = probs.float().argmax(1).cpu()
                for k in range(img.shape[0]):
                    yield img[k], lab[k], pred[k]
    finally:
        model.train(was)


def evaluate_seg(
    model: EncoderDecoder,
    dataset,
    cfg: dict,
    device: torch.device,
    info: Optional[DistInfo] = None,
    *,
    amp: str = "none",
    progress: bool = False,
) -> dict:
    """mIoU / mAcc / aAcc (percent) over ``dataset``, each process taking every world_size-th image
    and the confusion matrices summed across processes."""
    info = info or DistInfo()
    metric = SegMetric(dataset.num_classes, int(cfg["model"]["ignore_index"]), dataset.classes)
    for _, lab, pred in predict_batches(
        model,
        dataset,
        cfg,
        device,
        indices=range(info.rank, len(dataset), info.world_size),
        amp=amp,
        progress=progress and info.is_main,
    ):
        metric.update(pred, lab)
    return metric.compute(info)


def save_predictions_png(
    model: EncoderDecoder, dataset, cfg: dict, device: torch.device, path, n: int = 4, title: Optional[str] = None
) -> pathlib.Path:
    """A PNG of ``n`` validation images: image, ground truth, prediction."""
    from .viz import save_predictions

    rows = list(predict_batches(model, dataset, cfg, device, indices=range(min(n, len(dataset)))))
    # ADE20K images differ in size (and are resized for the model): show each at its label's size
    imgs = [resize(r[0][None], r[1].shape[-2:])[0].div(255).clamp(0, 1) for r in rows]
    return save_predictions(
        imgs,
        [r[1] for r in rows],
        [r[2] for r in rows],
        path,
        dataset.classes,
        title=title,
        ignore_index=int(cfg["model"]["ignore_index"]),
    )


SEG_CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "step", "config", "num_classes")


def load_run_checkpoint(path, keys=SEG_CHECKPOINT_KEYS, kind: str = "segmentation") -> dict:
    """A checkpoint written by :func:`train_seg` (or the detection engine, with its ``keys``);
    ValueError naming the file when it is not one."""
    state = read_checkpoint(path, weights_only=False)  # ours: configs and RNG states beside the weights
    missing = [k for k in keys if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(
            f"{path} is not a {kind} checkpoint of inline-attn (no {', '.join(missing)}); "
            f"to start from its weights use --model.checkpoint or --model.pretrained"
        )
    return state


def load_seg_checkpoint(path) -> dict:
    """A checkpoint written by :func:`train_seg` (ValueError naming the file when it is not one)."""
    return load_run_checkpoint(path)


def load_segmentor(path, device="cpu") -> tuple[EncoderDecoder, dict]:
    """(model, config) from a ``last.pth`` written by :func:`train_seg`."""
    state = load_seg_checkpoint(path)
    cfg = state["config"]
    cfg = dict(cfg, model=dict(cfg["model"], checkpoint=None, pretrained=None))
    model = build_from_config(cfg, int(state["num_classes"]))
    load_weights(model, path)
    return model.to(device), cfg


def _resume_from(resume, out: pathlib.Path, load=load_seg_checkpoint):
    """(path, checkpoint) to continue from: ``"auto"`` takes the output folder's newest readable
    checkpoint (``last.pth``, else ``previous.pth``; none: a new run), a path that file;
    ``load`` reads and checks one (segmentation or detection)."""
    if not resume:
        return None, None
    if resume != "auto":
        return pathlib.Path(resume), load(resume)
    for path in find_resume(out):
        try:
            return path, load(path)
        except ValueError as e:
            log.warning("%s; trying the previous checkpoint", e)
    return None, None


SEG_CSV = ["step", "lr", "loss", "loss_decode", "loss_aux", "mIoU", "mAcc", "aAcc", "img_s", "elapsed_s"]


def _write_csv(history: list[dict], path: pathlib.Path, cols: list[str] = SEG_CSV) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for row in history:
        w.writerow({k: ("" if row.get(k) is None else row[k]) for k in cols})
    atomic_write_text(path, buf.getvalue())


def train_seg(
    cfg: dict, *, rank: Optional[int] = None, world_size: Optional[int] = None, init_method: Optional[str] = None
) -> dict:
    """Train a segmentor with ``cfg`` (see :mod:`inline_attn.dense.config`); returns the summary.

    ``rank`` / ``world_size`` / ``init_method`` join a process group explicitly (tests); under
    torchrun they come from the environment.
    """
    t = cfg["train"]
    threads = torch.get_num_threads()
    if t["threads"]:
        torch.set_num_threads(int(t["threads"]))
    info = init_distributed(t["device"], rank=rank, world_size=world_size, init_method=init_method)
    det = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        return _train(cfg, info)
    finally:
        torch.use_deterministic_algorithms(det[0], warn_only=det[1])
        torch.set_num_threads(threads)
        cleanup(info)


def _train(cfg: dict, info: DistInfo) -> dict:
    from tqdm import tqdm

    t_cfg, o_cfg, s_cfg, e_cfg = cfg["train"], cfg["optim"], cfg["sched"], cfg["eval"]
    device = info.device
    out = pathlib.Path(t_cfg["output"])
    if t_cfg["deterministic"]:
        torch.use_deterministic_algorithms(True, warn_only=True)
    seed = int(t_cfg["seed"])
    show = info.is_main and bool(t_cfg["progress"])
    train_set, val_set = build_seg_datasets(cfg, progress=show)
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    model = build_from_config(cfg, train_set.num_classes).to(device)
    n_params = count_params(model)
    opt = o_cfg["opt"]
    groups = param_groups(model, float(o_cfg["weight_decay"]))
    lr = float(o_cfg["lr"])
    if opt == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=lr, betas=tuple(o_cfg["betas"]), eps=float(o_cfg["eps"]))
    elif opt == "sgd":
        optimizer = torch.optim.SGD(groups, lr=lr, momentum=0.9)
    else:
        raise ValueError(f"optim.opt={opt!r}: expected 'adamw' or 'sgd'")
    iters = int(s_cfg["iters"])
    sched = PolySchedule(
        optimizer,
        lr=lr,
        iters=iters,
        power=float(s_cfg["power"]),
        min_lr=float(s_cfg["min_lr"]),
        warmup_iters=int(s_cfg["warmup_iters"]),
        warmup_ratio=float(s_cfg["warmup_ratio"]),
    )
    amp = _resolve_amp(t_cfg["amp"], device)
    scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None
    norm = _Normalize(cfg["data"]["mean"], cfg["data"]["std"]).to(device)

    step, history, elapsed = 0, [], 0.0
    resume_path, state = _resume_from(t_cfg["resume"], out)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        step, history, elapsed = int(state["step"]), state.get("history", []), float(state.get("elapsed_s", 0.0))
        ranks = state.get("rng", [])
        if len(ranks) == info.world_size:
            torch.set_rng_state(ranks[info.rank])
        if info.is_main:
            log.info("resumed from %s at iteration %d", resume_path, step)
    else:
        torch.manual_seed(seed + 1000003 * info.rank)  # dropout / drop path differ per rank

    ddp = model
    if info.enabled and device.type == "cuda":  # the heads' BatchNorm over all GPUs (mmseg's SyncBN)
        model = ddp = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if info.enabled:
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.yaml")

    sampler = StepSampler(
        len(train_set), int(cfg["data"]["batch_size"]), seed=seed, rank=info.rank, world_size=info.world_size
    )
    workers = int(cfg["data"]["workers"])
    if workers:  # the sampler's batches, prepared by loader processes
        batches = iter(
            torch.utils.data.DataLoader(
                train_set, batch_sampler=list(sampler.steps(step, iters)), num_workers=workers, collate_fn=collate
            )
        )
    else:
        batches = (collate([train_set[i] for i in b]) for b in sampler.steps(step, iters))
    t_start = time.time()

    def save() -> Optional[pathlib.Path]:
        rng = [torch.get_rng_state()]
        if info.enabled:
            import torch.distributed as dist

            rng = [None] * info.world_size
            dist.all_gather_object(rng, torch.get_rng_state())
        if not info.is_main:
            return None
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": sched.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "step": step,
            "history": history,
            "config": cfg,
            "num_classes": train_set.num_classes,
            "classes": list(train_set.classes),
            "rng": rng,
            "elapsed_s": elapsed + time.time() - t_start,
            "world_size": info.world_size,
        }
        return save_rotating(state, out)

    def evaluate_now() -> dict:
        res = evaluate_seg(model, val_set, cfg, device, info, amp=amp, progress=show)
        return {k: res[k] for k in ("mIoU", "mAcc", "aAcc")} | {"per_class_IoU": res["IoU"]}

    max_steps = int(t_cfg["max_steps"] or 0)
    log_every, ckpt_every, eval_every = (
        int(t_cfg["log_interval"]),
        int(t_cfg["checkpoint_interval"]),
        int(e_cfg["interval"]),
    )
    pbar = tqdm(
        total=iters, initial=step, desc="train", dynamic_ncols=True, mininterval=1.0, file=sys.stderr, disable=not show
    )
    window = torch.zeros(4, dtype=torch.float64)  # loss, loss_decode, loss_aux, images (this rank)
    t_win, stopped, last_eval = time.time(), None, None
    model.train()
    try:
        while step < iters:
            img, lab = next(batches)
            x = norm(img.to(device, non_blocking=True))
            y = lab.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with autocast(device, amp):
                losses = ddp(x, y)
            loss = losses["loss"]
            optimizer_step(loss, step, model, optimizer, scaler, o_cfg["clip_grad"])
            sched.step()
            step += 1
            window += torch.tensor(
                [loss.item(), losses["loss_decode"].item(), losses.get("loss_aux", torch.zeros(())).item(), x.shape[0]],
                dtype=torch.float64,
            )
            pbar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{optimizer.param_groups[0]['lr']:.2e}", refresh=False)
            pbar.update(1)
            final = step == iters or (max_steps and step >= max_steps)
            if step % log_every == 0 or final or (eval_every and step % eval_every == 0):
                n_steps = max(1, int(round(window[3].item() / x.shape[0])))
                sums = all_reduce(window.clone(), info)
                row = {
                    "step": step,
                    "lr": sched.lr_at(step - 1),
                    "loss": sums[0].item() / n_steps / info.world_size,
                    "loss_decode": sums[1].item() / n_steps / info.world_size,
                    "loss_aux": sums[2].item() / n_steps / info.world_size if "loss_aux" in losses else None,
                    "img_s": round(sums[3].item() / max(time.time() - t_win, 1e-9), 2),
                    "elapsed_s": round(elapsed + time.time() - t_start, 1),
                }
                window.zero_()
                t_win = time.time()
                if (eval_every and step % eval_every == 0) or step == iters:
                    last_eval = evaluate_now()
                    row.update({k: round(v, 2) for k, v in last_eval.items() if k != "per_class_IoU"})
                    if info.is_main:
                        pbar.write(
                            f"iteration {step}/{iters}  mIoU {row['mIoU']:.2f}  mAcc {row['mAcc']:.2f}  "
                            f"aAcc {row['aAcc']:.2f}"
                        )
                    model.train()
                history.append(row)
                if info.is_main:
                    _write_csv(history, out / "metrics.csv")
            if step % ckpt_every == 0 or final:
                save()
            if max_steps and step >= max_steps and step < iters:
                stopped = "max_steps"
                break
    finally:
        pbar.close()
    total_time = elapsed + time.time() - t_start
    summary = {
        "backbone": cfg["model"]["backbone"],
        "decode": cfg["model"]["decode"],
        "params": n_params,
        "iterations": step,
        "world_size": info.world_size,
        "device": str(device),
        "stopped": stopped,
        "train_time_s": round(total_time, 1),
        "checkpoint": str(out / LAST),
        "output": str(out),
        "classes": list(train_set.classes),
    }
    if last_eval is not None:
        summary.update(
            {k: last_eval[k] for k in ("mIoU", "mAcc", "aAcc")},
            per_class_IoU=dict(zip(train_set.classes, last_eval["per_class_IoU"])),
        )
    if info.is_main:
        if stopped is None and t_cfg["predictions_png"]:
            try:
                summary["predictions_png"] = str(
                    save_predictions_png(
                        model,
                        val_set,
                        cfg,
                        device,
                        out / "predictions.png",
                        title=f"{cfg['model']['backbone']} + {cfg['model']['decode']}, iteration {step}"
                        + (f", mIoU {last_eval['mIoU']:.1f}" if last_eval else ""),
                    )
                )
            except Exception as e:  # a picture is a report, never a reason to fail a finished run
                log.warning("predictions PNG failed: %s", e)
        write_json(
            {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()},
            out / "summary.json",
        )
        if stopped:
            print(f"stopped ({stopped}) at iteration {step}; continue with --train.resume auto", file=sys.stderr)
    barrier(info)
    return summary
