"""Detection training and evaluation (FCOS on the mosaics or a COCO-layout folder), on the
segmentation engine's pieces: poly schedule, normalisation, AdamW parameter groups, atomic
rotating checkpoints with resume, metrics CSV, summary JSON. One process.

``train_det(cfg)`` writes into ``train.output``: ``config.yaml``, ``last.pth`` (atomically, every
``train.checkpoint_interval`` iterations and at the end), ``metrics.csv``, ``summary.json`` and
``detections.png`` (validation images: ground truth beside the detections).
"""

from __future__ import annotations

import logging
import math
import pathlib
import sys
import time
from typing import Optional

import numpy as np
import torch

from ..models.profile import count_params
from ..train.checkpoint import LAST, save_rotating
from ..train.distributed import cleanup, init_distributed
from ..train.engine import autocast
from ..train.optim import param_groups
from ..train.report import write_json
from .coco import coco_box_ap, to_coco_detections
from .config import save_config
from .data import StepSampler, build_det_datasets, det_collate
from .detector import FCOS, build_detector
from .engine import (
    SEG_CHECKPOINT_KEYS,
    PolySchedule,
    _Normalize,
    _resolve_amp,
    _resume_from,
    _write_csv,
    load_run_checkpoint,
    load_weights,
    optimizer_step,
)

log = logging.getLogger(__name__)

__all__ = ["build_det_from_config", "evaluate_det", "load_detector", "predict_det", "train_det"]

DET_CHECKPOINT_KEYS = SEG_CHECKPOINT_KEYS + ("detector",)
HEAD_KEY = "head.cls_logits.weight"
DET_CSV = ["step", "lr", "loss", "loss_cls", "loss_box", "loss_ctr", "AP", "AP50", "AP75", "img_s", "elapsed_s"]
_HEAD_OPTIONS = (
    "num_convs",
    "range_scale",
    "center_radius",
    "focal_alpha",
    "focal_gamma",
    "score_threshold",
    "pre_nms",
    "nms_iou",
    "max_per_image",
)


def build_det_from_config(cfg: dict, num_classes: int) -> FCOS:
    """The FCOS detector of ``cfg["model"]`` for ``num_classes`` classes (weights from
    ``model.checkpoint`` when set; backbone from ``model.pretrained`` when set)."""
    m = cfg["model"]
    if m["num_classes"] is not None and int(m["num_classes"]) != num_classes:
        raise ValueError(f"model.num_classes={m['num_classes']} but the dataset has {num_classes} classes")
    bkw = dict(m["backbone_kwargs"] or {})
    bkw.update(
        frozen_stages=int(m["frozen_stages"]),
        norm_eval=bool(m["norm_eval"]),
        pretrained=m["pretrained"],
        weights_only=False,
    )
    if m["drop_path"] is not None:
        bkw["drop_path_rate"] = float(m["drop_path"])
    try:
        model = build_detector(
            m["backbone"],
            num_classes,
            backbone_kwargs=bkw,
            neck_channels=int(m["neck_channels"]),
            head_channels=m["head_channels"],
            **{k: m[k] for k in _HEAD_OPTIONS},
        )
    except TypeError as e:
        raise ValueError(
            f"backbone {m['backbone']!r} rejected model.backbone_kwargs {m['backbone_kwargs']}: {e}"
        ) from e
    if m["checkpoint"]:
        load_weights(model, m["checkpoint"], HEAD_KEY)
    return model


def load_det_checkpoint(path) -> dict:
    return load_run_checkpoint(path, DET_CHECKPOINT_KEYS, "detection")


def load_detector(path, device="cpu") -> tuple[FCOS, dict]:
    """(model, config) from a ``last.pth`` written by :func:`train_det`."""
    state = load_det_checkpoint(path)
    cfg = state["config"]
    cfg = dict(cfg, model=dict(cfg["model"], checkpoint=None, pretrained=None))
    model = build_det_from_config(cfg, int(state["num_classes"]))
    load_weights(model, path, HEAD_KEY)
    return model.to(device), cfg


@torch.no_grad()
def predict_det(model: FCOS, dataset, cfg: dict, device, *, indices=None, amp: str = "none", progress: bool = False):
    """Yield (index, image [3, h, w] 0-255, target, detections) for ``indices`` of ``dataset``."""
    from tqdm import tqdm

    norm = _Normalize(cfg["data"]["mean"], cfg["data"]["std"]).to(device)
    indices = list(range(len(dataset))) if indices is None else list(indices)
    bs = max(1, int(cfg["eval"]["batch_size"]))
    was = model.training
    model.eval()
    try:
        for start in tqdm(
            range(0, len(indices), bs), desc="eval", disable=not progress, leave=False, file=sys.stderr, mininterval=1.0
        ):
            idx = indices[start : start + bs]
            items = [dataset[i] for i in idx]
            img, targets, sizes = det_collate(items)
            with autocast(device, amp):
                res = model.predict(norm(img.to(device)), sizes)
            for i, it, t, r in zip(idx, items, targets, res):
                yield i, it[0], t, {k: v.float().cpu() if k != "labels" else v.cpu() for k, v in r.items()}
    finally:
        model.train(was)


def evaluate_det(model: FCOS, dataset, cfg: dict, device, *, amp: str = "none", progress: bool = False) -> dict:
    """COCO box AP (percent: AP, AP50, AP75, APs, APm, APl) of ``model`` on ``dataset`` (which
    gives ``coco_gt()``, ``image_id(i)``, ``scale(i)`` and ``cat_ids``)."""
    dets = []
    for i, _, _, r in predict_det(model, dataset, cfg, device, amp=amp, progress=progress):
        dets += to_coco_detections(r, dataset.image_id(i), dataset.cat_ids, dataset.scale(i))
    gt = dataset.coco_gt()
    if len(dataset) < len(gt["images"]):  # a subset: its images only
        ids = {dataset.image_id(i) for i in range(len(dataset))}
        gt = dict(
            gt,
            images=[im for im in gt["images"] if im["id"] in ids],
            annotations=[a for a in gt["annotations"] if a["image_id"] in ids],
        )
    return coco_box_ap(gt, dets)


def save_detections_png(model, dataset, cfg, device, path, n: int = 4, title: Optional[str] = None):
    """A PNG of ``n`` validation images: ground truth beside the detections."""
    from .viz import save_detections

    rows = list(predict_det(model, dataset, cfg, device, indices=range(min(n, len(dataset)))))
    return save_detections(
        [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows], path, dataset.classes, title=title
    )


def train_det(cfg: dict) -> dict:
    """Train an FCOS detector with ``cfg`` (see :data:`~inline_attn.dense.config.DET_DEFAULTS`);
    returns the summary."""
    t = cfg["train"]
    threads = torch.get_num_threads()
    if t["threads"]:
        torch.set_num_threads(int(t["threads"]))
    info = init_distributed(t["device"])
    try:
        if info.enabled:
            raise ValueError(f"detection training runs in one process (got world size {info.world_size})")
        return _train(cfg, info.device)
    finally:
        torch.set_num_threads(threads)
        cleanup(info)


def _train(cfg: dict, device: torch.device) -> dict:
    from tqdm import tqdm

    t_cfg, o_cfg, s_cfg, e_cfg = cfg["train"], cfg["optim"], cfg["sched"], cfg["eval"]
    out = pathlib.Path(t_cfg["output"])
    seed = int(t_cfg["seed"])
    show = bool(t_cfg["progress"])
    train_set, val_set = build_det_datasets(cfg, progress=show)
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    model = build_det_from_config(cfg, train_set.num_classes).to(device)
    n_params = count_params(model)
    groups = param_groups(model, float(o_cfg["weight_decay"]))
    lr = float(o_cfg["lr"])
    if o_cfg["opt"] == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=lr, betas=tuple(o_cfg["betas"]), eps=float(o_cfg["eps"]))
    elif o_cfg["opt"] == "sgd":
        optimizer = torch.optim.SGD(groups, lr=lr, momentum=0.9)
    else:
        raise ValueError(f"optim.opt={o_cfg['opt']!r}: expected 'adamw' or 'sgd'")
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
    resume_path, state = _resume_from(t_cfg["resume"], out, load_det_checkpoint)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        step, history, elapsed = int(state["step"]), state.get("history", []), float(state.get("elapsed_s", 0.0))
        if state.get("rng") is not None:
            torch.set_rng_state(state["rng"])
        log.info("resumed from %s at iteration %d", resume_path, step)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")

    sampler = StepSampler(len(train_set), int(cfg["data"]["batch_size"]), seed=seed)
    t_start = time.time()

    def save() -> pathlib.Path:
        return save_rotating(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": sched.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else None,
                "step": step,
                "history": history,
                "config": cfg,
                "num_classes": train_set.num_classes,
                "classes": list(train_set.classes),
                "detector": "fcos",
                "rng": torch.get_rng_state(),
                "elapsed_s": elapsed + time.time() - t_start,
            },
            out,
        )

    max_steps = int(t_cfg["max_steps"] or 0)
    log_every, ckpt_every, eval_every = (
        int(t_cfg["log_interval"]),
        int(t_cfg["checkpoint_interval"]),
        int(e_cfg["interval"]),
    )
    pbar = tqdm(
        total=iters, initial=step, desc="train", dynamic_ncols=True, mininterval=1.0, file=sys.stderr, disable=not show
    )
    window = torch.zeros(5, dtype=torch.float64)  # loss, cls, box, ctr, images
    t_win, stopped, last_eval = time.time(), None, None
    model.train()
    try:
        while step < iters:
            img, targets, _ = det_collate([train_set[i] for i in sampler.batch(step)])
            x = norm(img.to(device))
            targets = [{k: v.to(device) for k, v in tg.items()} for tg in targets]
            optimizer.zero_grad(set_to_none=True)
            with autocast(device, amp):
                losses = model(x, targets)
            loss = losses["loss"]
            optimizer_step(loss, step, model, optimizer, scaler, o_cfg["clip_grad"])
            sched.step()
            step += 1
            window += torch.tensor(
                [losses[k].item() for k in ("loss", "loss_cls", "loss_box", "loss_ctr")] + [x.shape[0]],
                dtype=torch.float64,
            )
            pbar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{optimizer.param_groups[0]['lr']:.2e}", refresh=False)
            pbar.update(1)
            final = step == iters or (max_steps and step >= max_steps)
            if step % log_every == 0 or final or (eval_every and step % eval_every == 0):
                n_steps = max(1, int(round(window[4].item() / x.shape[0])))
                row = {
                    k: window[j].item() / n_steps for j, k in enumerate(("loss", "loss_cls", "loss_box", "loss_ctr"))
                }
                row.update(
                    step=step,
                    lr=sched.lr_at(step - 1),
                    img_s=round(window[4].item() / max(time.time() - t_win, 1e-9), 2),
                    elapsed_s=round(elapsed + time.time() - t_start, 1),
                )
                window.zero_()
                t_win = time.time()
                if (eval_every and step % eval_every == 0) or step == iters:
                    last_eval = evaluate_det(model, val_set, cfg, device, amp=amp, progress=show)
                    row.update({k: round(last_eval[k], 2) for k in ("AP", "AP50", "AP75")})
                    pbar.write(f"iteration {step}/{iters}  box AP {row['AP']:.2f}  AP50 {row['AP50']:.2f}")
                    model.train()
                history.append(row)
                _write_csv(history, out / "metrics.csv", DET_CSV)
            if step % ckpt_every == 0 or final:
                save()
            if max_steps and step >= max_steps and step < iters:
                stopped = "max_steps"
                break
    finally:
        pbar.close()
    summary = {
        "backbone": cfg["model"]["backbone"],
        "detector": "fcos",
        "params": n_params,
        "iterations": step,
        "device": str(device),
        "stopped": stopped,
        "train_time_s": round(elapsed + time.time() - t_start, 1),
        "checkpoint": str(out / LAST),
        "output": str(out),
        "classes": list(train_set.classes),
        "first_loss": history[0]["loss"] if history else None,
        "last_loss": history[-1]["loss"] if history else None,
    }
    if last_eval is not None:
        summary.update(last_eval)
    if stopped is None and t_cfg["predictions_png"]:
        try:
            summary["detections_png"] = str(
                save_detections_png(
                    model,
                    val_set,
                    cfg,
                    device,
                    out / "detections.png",
                    title=f"FCOS on {cfg['model']['backbone']}, iteration {step}"
                    + (f", box AP {last_eval['AP']:.1f}" if last_eval else ""),
                )
            )
        except Exception as e:  # a picture is a report, never a reason to fail a finished run
            log.warning("detections PNG failed: %s", e)
    write_json(
        {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()}, out / "summary.json"
    )
    if stopped:
        print(f"stopped ({stopped}) at iteration {step}; continue with --train.resume auto", file=sys.stderr)
    return summary
