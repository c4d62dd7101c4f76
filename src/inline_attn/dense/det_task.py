"""Detection training and evaluation: :class:`DetTask`, the detection hooks of the one run
(:mod:`inline_attn.runtime.run`: poly schedule, atomic rotating checkpoints with resume and its
checks, signals, metrics CSV, summary JSON; one process) for FCOS on the mosaics or a
COCO-layout folder, COCO box AP, a picture of detections.

``inline_attn.runtime.run.train(DetTask(), cfg)`` writes into ``train.output``: ``config.yaml``,
``last.pth`` (atomically, every ``train.checkpoint_interval`` iterations, at the end and on SIGINT /
SIGTERM), ``metrics.csv``, ``summary.json`` and ``detections.png`` (validation images: ground truth
beside the detections).
"""

from __future__ import annotations

import pathlib
import time
from typing import Any, Iterable, Iterator, Optional

import torch
import torch.nn as nn

from ..runtime.report import write_json
from ..runtime.amp import autocast
from ..runtime.progress import progress_bar
from ..runtime.distributed import DistInfo, resolve_device
from .data.coco import coco_box_ap, to_coco_detections
from .config import DetConfig
from .data.loading import StepSampler, build_det_datasets, det_collate
from .models.detector import FCOS, build_detector
from .evaluation import check_class_count, eval_config
from ..data.transforms import Normalize
from ..runtime.checkpoint import read_run_checkpoint
from .build import DenseTask, build_dense_model, load_trained

__all__ = [
    "DetTask",
    "build_det_from_config",
    "evaluate_checkpoint",
    "evaluate_det",
    "load_detector",
    "predict_det",
]

DET_CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "step", "config", "num_classes", "detector")
HEAD_KEY = "head.cls_logits.weight"
DET_CSV = ["step", "lr", "loss", "loss_cls", "loss_box", "loss_ctr", "AP", "AP50", "AP75", "img_s", "elapsed_s"]


def build_det_from_config(cfg: DetConfig, num_classes: int) -> FCOS:
    """The FCOS detector of ``cfg.model`` for ``num_classes`` classes (weights from
    ``model.checkpoint`` when set; backbone from ``model.pretrained`` when set); every setting of
    the model section that is not the backbone's goes to :func:`build_detector` by name."""
    return build_dense_model(cfg, num_classes, build_detector, HEAD_KEY)


def load_det_checkpoint(path) -> dict:
    """A checkpoint written by a detection run (ValueError naming the file when it is not one;
    a segmentation checkpoint is named as such)."""
    try:
        return read_run_checkpoint(path, DET_CHECKPOINT_KEYS, "detection")
    except ValueError:
        read_run_checkpoint(path, DET_CHECKPOINT_KEYS[:-1], "detection")  # not even a dense run: its own message
        raise ValueError(f"{path} is a segmentation checkpoint: evaluate it with `inline-attn seg eval`") from None


def load_detector(path, device="cpu") -> tuple[FCOS, DetConfig]:
    """(model, config) from a ``last.pth`` written by a detection run."""
    return load_trained(DetTask(), path, load_det_checkpoint(path), device)


@torch.no_grad()
def predict_det(
    model: FCOS,
    dataset,
    cfg: DetConfig,
    device,
    *,
    indices=None,
    amp: str = "none",
    progress: bool = False,
    source: str = "the model",
):
    """Yield (index, image [3, h, w] 0-255, target, detections) for ``indices`` of ``dataset``.
    Non-finite head outputs raise :class:`~inline_attn.runtime.finite.NonFiniteOutputs` naming
    ``source``."""
    norm = Normalize(cfg.data.mean, cfg.data.std).to(device)
    indices = list(range(len(dataset))) if indices is None else list(indices)
    bs = cfg.eval.batch_size
    was = model.training
    model.eval()
    try:
        for start in progress_bar(range(0, len(indices), bs), desc="eval", progress=progress, leave=False):
            idx = indices[start : start + bs]
            items = [dataset[i] for i in idx]
            img, targets, sizes = det_collate(items)
            with autocast(device, amp):
                res = model.predict(norm(img.to(device)), sizes, source=source)
            for i, it, t, r in zip(idx, items, targets, res):
                yield i, it[0], t, {k: v.float().cpu() if k != "labels" else v.cpu() for k, v in r.items()}
    finally:
        model.train(was)


def evaluate_det(
    model: FCOS,
    dataset,
    cfg: DetConfig,
    device,
    *,
    amp: str = "none",
    progress: bool = False,
    source: str = "the model",
) -> dict:
    """COCO box AP (percent: AP, AP50, AP75, APs, APm, APl) of ``model`` on ``dataset`` (which
    gives ``coco_gt()``, ``image_id(i)``, ``scale(i)`` and ``cat_ids``). A model with non-finite
    outputs is not scored: a ValueError naming ``source`` (the checkpoint)."""
    dets = []
    for i, _, _, r in predict_det(model, dataset, cfg, device, amp=amp, progress=progress, source=source):
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


class DetTask(DenseTask):
    """FCOS detection: focal, GIoU and centre-ness losses, COCO box AP; one process."""

    kind = "detection"
    config = DetConfig
    head_key = HEAD_KEY
    checkpoint_keys = DET_CHECKPOINT_KEYS
    csv_columns = DET_CSV
    loss_keys = ("loss", "loss_cls", "loss_box", "loss_ctr")
    metric_keys = ("AP", "AP50", "AP75")
    distributed = False
    extras = {"detector": "fcos"}
    not_graphed = (
        "FCOS's targets are a different number of boxes in every image, and its losses select the positive "
        "points (shapes that depend on the data; a CUDA graph replays fixed shapes)"
    )

    def datasets(self, cfg: DetConfig, info: DistInfo, progress: bool):
        return build_det_datasets(cfg, progress=progress)

    def build_model(self, cfg: DetConfig, num_classes: int) -> nn.Module:
        return build_det_from_config(cfg, num_classes)

    def batches(self, train_set, cfg: DetConfig, info: DistInfo, step: int) -> Iterator:
        sampler = StepSampler(len(train_set), cfg.data.batch_size, seed=cfg.train.seed)
        return (det_collate([train_set[i] for i in b]) for b in sampler.steps(step, cfg.sched.iters))

    def losses(self, model, batch, norm: nn.Module, device: torch.device, amp: str) -> tuple[dict, int]:
        img, targets, _ = batch
        x = norm(img.to(device))
        targets = [{k: v.to(device) for k, v in tg.items()} for tg in targets]
        with autocast(device, amp):
            losses = model(x, targets)
        return losses, x.shape[0]

    def evaluate(self, model, val_set, cfg, device, info, amp, progress, forward=None) -> dict:
        return evaluate_det(model, val_set, cfg, device, amp=amp, progress=progress)

    def eval_line(self, row: dict) -> str:
        return f"box AP {row['AP']:.2f}  AP50 {row['AP50']:.2f}"

    def result_line(self, res: dict) -> str:
        """The metrics of a finished run or an evaluation, as the commands print them."""
        return f"box AP {res['AP']:.2f}  AP50 {res['AP50']:.2f}  AP75 {res['AP75']:.2f}"

    def summary(
        self, cfg: DetConfig, model: nn.Module, history: list, last_eval: Optional[dict], classes: list
    ) -> dict:
        out = {
            "classes": classes,
            "detector": "fcos",
            "first_loss": history[0]["loss"] if history else None,
            "last_loss": history[-1]["loss"] if history else None,
        }
        return out | (last_eval or {})

    def picture(self, model, val_set, cfg: DetConfig, device, out: pathlib.Path, step: int, history: list, last_eval):
        title = f"FCOS on {cfg.model.backbone}, iteration {step}"
        title += f", box AP {last_eval['AP']:.1f}" if last_eval else ""
        return "detections_png", save_detections_png(model, val_set, cfg, device, out / "detections.png", title=title)


def evaluate_checkpoint(
    checkpoint,
    *,
    overrides: Iterable[tuple[str, Any]] = (),
    device: str = "auto",
    amp: str = "none",
    json_path=None,
    png=None,
) -> dict:
    """COCO box AP (AP, AP50, AP75, APs, APm, APl) of a ``last.pth`` written by a detection run, on
    its config's validation set with ``overrides`` (dotted keys; not ``model.*``), in one process
    with the run's thread count.

    Writes ``png`` (a few images: ground truth beside the detections) and ``json_path`` (the result).
    The result adds ``checkpoint``, ``backbone``, ``images``, ``eval_time_s`` and, with ``png``,
    ``detections_png`` to the metrics.
    """
    dev = resolve_device(device, what="--device")
    model, cfg = load_detector(checkpoint, dev)
    cfg = eval_config(cfg, overrides, "det", reads=("train.threads",))
    if cfg.train.threads:  # the run's thread count (small ops: a second thread may only contend)
        torch.set_num_threads(int(cfg.train.threads))
    _, val = build_det_datasets(cfg, train=False, progress=True)
    check_class_count(model, val, checkpoint)
    t0 = time.time()
    res = evaluate_det(model, val, cfg, dev, amp=amp, progress=True, source=f"checkpoint {checkpoint}")
    res.update(checkpoint=str(checkpoint), backbone=cfg.model.backbone, images=len(val))
    res["eval_time_s"] = round(time.time() - t0, 1)
    if png:
        res["detections_png"] = str(save_detections_png(model, val, cfg, dev, png))
    if json_path:
        write_json(res, json_path)
    return res
