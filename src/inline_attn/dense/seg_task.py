"""Segmentation training and evaluation: :class:`SegTask`, the segmentation hooks of the one run
(:mod:`inline_attn.runtime.run`: iteration-based, one process or many under torchrun, resumable,
interruptible, with AMP) and inference (whole / slide, flip), mIoU, a picture of predictions.

``inline_attn.runtime.run.train(SegTask(), cfg)`` writes, from rank 0, into ``train.output``:
``config.yaml``, ``last.pth`` (atomically, every ``train.checkpoint_interval`` iterations, at the
end and on SIGINT / SIGTERM), ``metrics.csv``, ``summary.json`` and ``predictions.png``
(validation images, ground truth, prediction).
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
from ..runtime.distributed import DistInfo
from ..runtime.finite import require_finite
from .config import SegConfig
from .data.loading import StepSampler, build_seg_datasets, collate
from .evaluation import check_class_count, eval_config
from .models.heads import resize
from .metrics import SegMetric
from ..data.transforms import Normalize
from ..runtime.checkpoint import read_run_checkpoint
from .build import DenseTask, build_dense_model, load_trained
from .models.segmentor import EncoderDecoder, HeadLogits, build_segmentor

__all__ = [
    "SegTask",
    "build_from_config",
    "evaluate_checkpoint",
    "evaluate_seg",
    "format_segmentor_info",
    "load_segmentor",
    "predict_batches",
    "segmentor_info",
]

HEAD_KEY = "decode_head.conv_seg.weight"
SEG_CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "step", "config", "num_classes")
SEG_CSV = ["step", "lr", "loss", "loss_decode", "loss_aux", "mIoU", "mAcc", "aAcc", "img_s", "elapsed_s"]


def build_from_config(cfg: SegConfig, num_classes: int) -> EncoderDecoder:
    """The segmentor of ``cfg.model`` for ``num_classes`` classes (weights from
    ``model.checkpoint`` when set; backbone from ``model.pretrained`` when set); every setting of
    the model section that is not the backbone's goes to :func:`build_segmentor` by name."""
    return build_dense_model(cfg, num_classes, build_segmentor, HEAD_KEY)


@torch.no_grad()
def predict_batches(
    model: EncoderDecoder,
    dataset,
    cfg: SegConfig,
    device: torch.device,
    *,
    indices=None,
    amp: str = "none",
    progress: bool = False,
    source: str = "the model",
):
    """Yield (image [3, H, W] 0-255, labels [H, W], predicted labels [H, W]) for ``indices`` of an
    evaluation ``dataset`` with the config's inference mode (whole / slide, flip). Non-finite
    class scores raise :class:`~inline_attn.runtime.finite.NonFiniteOutputs` naming ``source``."""
    e = cfg.eval
    norm = Normalize(cfg.data.mean, cfg.data.std).to(device)
    indices = list(range(len(dataset))) if indices is None else list(indices)
    bs = e.batch_size
    was = model.training
    model.eval()
    try:
        for start in progress_bar(range(0, len(indices), bs), desc="eval", progress=progress, leave=False):
            items = [dataset[i] for i in indices[start : start + bs]]
            same = len({tuple(it[0].shape) for it in items}) == 1 and len({tuple(it[1].shape) for it in items}) == 1
            groups = [collate(items)] if same else [collate([it]) for it in items]
            for img, lab in groups:
                x = norm(img.to(device))
                with autocast(device, amp):
                    probs = model.predict(
                        x, mode=e.mode, crop=e.crop_size, stride=e.stride, out_size=lab.shape[-2:], flip=e.flip
                    )
                require_finite(probs, source, "class scores")
                pred = probs.float().argmax(1).cpu()
                for k in range(img.shape[0]):
                    yield img[k], lab[k], pred[k]
    finally:
        model.train(was)


def evaluate_seg(
    model: EncoderDecoder,
    dataset,
    cfg: SegConfig,
    device: torch.device,
    info: Optional[DistInfo] = None,
    *,
    amp: str = "none",
    progress: bool = False,
    source: str = "the model",
) -> dict:
    """mIoU / mAcc / aAcc (percent) over ``dataset``, each process taking every world_size-th image
    and the confusion matrices summed across processes. A model with non-finite outputs is not
    scored: a ValueError naming ``source`` (the checkpoint)."""
    info = info or DistInfo()
    metric = SegMetric(dataset.num_classes, cfg.model.ignore_index, dataset.classes)
    for _, lab, pred in predict_batches(
        model,
        dataset,
        cfg,
        device,
        indices=range(info.rank, len(dataset), info.world_size),
        amp=amp,
        progress=progress and info.is_main,
        source=source,
    ):
        metric.update(pred, lab)
    return metric.compute(info)


def save_predictions_png(
    model: EncoderDecoder, dataset, cfg: SegConfig, device: torch.device, path, n: int = 4, title: Optional[str] = None
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
        ignore_index=cfg.model.ignore_index,
    )


def load_seg_checkpoint(path) -> dict:
    """A checkpoint written by a segmentation run (ValueError naming the file when it is not one,
    or when it is a detection checkpoint, which holds every key of ours and more)."""
    state = read_run_checkpoint(path, SEG_CHECKPOINT_KEYS, "segmentation")
    if "detector" in state:
        raise ValueError(f"{path} is a detection checkpoint: evaluate it with `inline-attn det eval`")
    return state


def load_segmentor(path, device="cpu") -> tuple[EncoderDecoder, SegConfig]:
    """(model, config) from a ``last.pth`` written by a segmentation run."""
    return load_trained(SegTask(), path, load_seg_checkpoint(path), device)


class SegTask(DenseTask):
    """Semantic segmentation: cross-entropy of the decode (and auxiliary) head, mIoU. Its
    ``criterion`` (the segmentor's :class:`~inline_attn.dense.models.losses.SegLoss`, set with the
    model) lets the run capture a step in a CUDA graph, the labels being fixed-size masks; the
    graphed step calls :class:`~inline_attn.dense.models.segmentor.HeadLogits` of the segmentor
    (``criterion_forward``) for every head's logits, which the criterion takes."""

    kind = "segmentation"
    config = SegConfig
    head_key = HEAD_KEY
    checkpoint_keys = SEG_CHECKPOINT_KEYS
    csv_columns = SEG_CSV
    loss_keys = ("loss", "loss_decode", "loss_aux")
    metric_keys = ("mIoU", "mAcc", "aAcc")
    criterion_forward = HeadLogits

    def datasets(self, cfg: SegConfig, info: DistInfo, progress: bool):
        return build_seg_datasets(cfg, progress=progress)

    def build_model(self, cfg: SegConfig, num_classes: int) -> nn.Module:
        model = build_from_config(cfg, num_classes)
        # the loss a CUDA-graphed step applies to every head's logits (``criterion_forward``): the
        # model's own (the same terms, weights, ignore index and mean as :meth:`losses`)
        self.criterion = model.criterion
        return model

    def batches(self, train_set, cfg: SegConfig, info: DistInfo, step: int) -> Iterator:
        sampler = StepSampler(
            len(train_set), cfg.data.batch_size, seed=cfg.train.seed, rank=info.rank, world_size=info.world_size
        )
        steps = sampler.steps(step, cfg.sched.iters)
        if not cfg.data.workers:
            return (collate([train_set[i] for i in b]) for b in steps)
        loader = torch.utils.data.DataLoader(  # the sampler's batches, prepared by loader processes
            train_set, batch_sampler=list(steps), num_workers=cfg.data.workers, collate_fn=collate
        )
        return iter(loader)

    def losses(self, model, batch, norm: nn.Module, device: torch.device, amp: str) -> tuple[dict, int]:
        img, lab = batch
        x = norm(img.to(device, non_blocking=True))
        with autocast(device, amp):
            losses = model(x, lab.to(device, non_blocking=True))
        return losses, x.shape[0]

    def evaluate(self, model, val_set, cfg, device, info, amp, progress, forward=None) -> dict:
        res = evaluate_seg(model, val_set, cfg, device, info, amp=amp, progress=progress)
        return {k: res[k] for k in self.metric_keys} | {"per_class_IoU": res["IoU"]}

    def eval_line(self, row: dict) -> str:
        return f"mIoU {row['mIoU']:.2f}  mAcc {row['mAcc']:.2f}  aAcc {row['aAcc']:.2f}"

    def result_line(self, res: dict) -> str:
        """The metrics of a finished run or an evaluation, as the commands print them."""
        return self.eval_line(res)

    def summary(
        self, cfg: SegConfig, model: nn.Module, history: list, last_eval: Optional[dict], classes: list
    ) -> dict:
        out = {"decode": cfg.model.decode, "classes": classes}
        if last_eval is not None:
            out.update({k: last_eval[k] for k in self.metric_keys})
            out["per_class_IoU"] = dict(zip(classes, last_eval["per_class_IoU"]))
        return out

    def picture(self, model, val_set, cfg: SegConfig, device, out: pathlib.Path, step: int, history: list, last_eval):
        title = f"{cfg.model.backbone} + {cfg.model.decode}, iteration {step}"
        title += f", mIoU {last_eval['mIoU']:.1f}" if last_eval else ""
        return "predictions_png", save_predictions_png(
            model, val_set, cfg, device, out / "predictions.png", title=title
        )


def evaluate_checkpoint(
    checkpoint,
    *,
    overrides: Iterable[tuple[str, Any]] = (),
    device: str = "auto",
    amp: str = "none",
    json_path=None,
    png=None,
) -> dict:
    """mIoU / mAcc / aAcc and per-class IoU / Acc (percent) of a ``last.pth`` written by
    a segmentation run, on its config's validation split with ``overrides`` (dotted keys; not
    ``model.*``). Under torchrun each process scores its share of the images.

    Rank 0 writes ``png`` (a few predictions beside the ground truth) and ``json_path`` (the result).
    The result adds ``checkpoint``, ``backbone``, ``decode``, ``mode`` (whole / slide), ``images``,
    ``eval_time_s``, ``rank`` and, with ``png``, ``predictions_png`` to the metrics.
    """
    from ..runtime.distributed import cleanup, init_distributed, resolve_device

    resolve_device(device, what="--device")  # a bad name is the eval flag's error, not train.device's
    info = init_distributed(device)
    try:
        model, cfg = load_segmentor(checkpoint, info.device)
        cfg = eval_config(cfg, overrides, "seg")
        _, val = build_seg_datasets(cfg, train=False, progress=info.is_main)
        check_class_count(model, val, checkpoint)
        t0 = time.time()
        res = evaluate_seg(
            model, val, cfg, info.device, info, amp=amp, progress=info.is_main, source=f"checkpoint {checkpoint}"
        )
        res.update(
            checkpoint=str(checkpoint),
            backbone=cfg.model.backbone,
            decode=cfg.model.decode,
            mode=cfg.eval.mode,
            images=len(val),
            eval_time_s=round(time.time() - t0, 1),
            rank=info.rank,
        )
        if info.is_main and png:
            res["predictions_png"] = str(save_predictions_png(model, val, cfg, info.device, png))
        if info.is_main and json_path:
            write_json(res, json_path)
    finally:
        cleanup(info)
    return res


def segmentor_info(config, overrides=(), *, num_classes=None, macs: bool = False) -> dict:
    """Parameter counts (backbone / neck / decode head / auxiliary head / total) of a config's
    segmentor, and its MACs at the crop size when ``macs``."""
    from ..models.profile import count_params, profile

    _refuse_unread_overrides(overrides, macs)
    cfg = SegConfig.load(config, overrides)
    n = num_classes or cfg.model.num_classes or (11 if cfg.data.dataset == "mosaic" else 150)
    model = build_from_config(cfg.replace(**{"model.pretrained": None, "model.checkpoint": None}), int(n))
    parts = {
        name: (count_params(getattr(model, name)) if getattr(model, name) is not None else 0)
        for name in ("backbone", "neck", "decode_head", "aux_head")
    }
    out = {
        "config": str(config),
        "backbone_name": cfg.model.backbone,
        "decode": cfg.model.decode,
        "num_classes": int(n),
        **parts,
        "params": count_params(model),
    }
    if macs:
        size = cfg.data.mosaic.size if cfg.data.dataset == "mosaic" else cfg.data.crop_size
        size = (size, size) if isinstance(size, int) else tuple(size)
        out["macs"] = profile(model, (3, *size)).macs
        out["macs_input"] = list(size)
    return out


def _refuse_unread_overrides(overrides, macs: bool) -> None:
    """``segmentor_info`` builds the model section's segmentor (without its weights) for the data
    set's classes, and reads the crop size only for the MACs: an override of anything else would
    change nothing it reports."""
    reads = ("data.dataset", "data.crop_size", "data.mosaic.size") if macs else ("data.dataset",)
    keys = [item[0] if isinstance(item, tuple) else str(item).split("=", 1)[0] for item in overrides]
    unread = [
        k for k in keys if not (k.startswith("model.") or k in reads) or k in ("model.pretrained", "model.checkpoint")
    ]
    if unread:
        what = "for data.dataset's classes" + (" and its MACs at data.crop_size" if macs else "")
        raise ValueError(
            f"{', '.join('--' + k for k in unread)}: seg info reports the parameters of the model section's "
            f"segmentor (random weights) {what}; that setting changes nothing in it"
        )


def format_segmentor_info(info: dict) -> str:
    """:func:`segmentor_info` as the lines ``inline-attn seg info`` prints."""
    lines = [f"{info['decode']} on {info['backbone_name']} ({info['num_classes']} classes; {info['config']})"]
    lines += [f"  {k:12s} {info[k]:>12,}" for k in ("backbone", "neck", "decode_head", "aux_head", "params")]
    if "macs" in info:
        lines.append(f"  MACs         {info['macs'] / 1e9:.3f} G at {info['macs_input'][0]}x{info['macs_input'][1]}")
    return "\n".join(lines)
