"""mIoU, mAcc and aAcc with mmseg's definitions, from a confusion matrix summed over images
(and over torchrun processes).

With ``C[g, p]`` the number of (non-ignored) pixels of ground-truth class g predicted as p:

- intersect_k = C[k, k], label_k = sum_p C[k, p], pred_k = sum_g C[g, k],
  union_k = label_k + pred_k - intersect_k;
- IoU_k = intersect_k / union_k, Acc_k = intersect_k / label_k (NaN when the denominator is 0);
- mIoU = nanmean_k IoU_k, mAcc = nanmean_k Acc_k, aAcc = sum_k intersect_k / sum_k label_k.

A class absent from the ground truth but predicted somewhere gets IoU 0 (it counts in mIoU) and
Acc NaN (it does not count in mAcc), as in mmseg's ``IoUMetric``. Reported in percent.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from .models.losses import check_labels

__all__ = ["SegMetric", "confusion_matrix", "metrics_from_confusion"]


def confusion_matrix(
    pred: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int = 255
) -> torch.Tensor:
    """pred, target: integer label maps of the same shape (any) -> [K, K] int64 counts, rows =
    ground truth, columns = prediction; pixels whose target is ``ignore_index`` are skipped."""
    if pred.shape != target.shape:
        raise ValueError(f"prediction {tuple(pred.shape)} and labels {tuple(target.shape)} differ in shape")
    check_labels(target, num_classes, ignore_index)
    keep = target != ignore_index
    t, p = target[keep].long(), pred[keep].long()
    if p.numel() and (int(p.min()) < 0 or int(p.max()) >= num_classes):
        raise ValueError(f"predictions must lie in [0, {num_classes}), got [{int(p.min())}, {int(p.max())}]")
    return torch.bincount(t * num_classes + p, minlength=num_classes * num_classes).view(num_classes, num_classes).cpu()


def metrics_from_confusion(conf: torch.Tensor, class_names: Optional[Sequence[str]] = None) -> dict:
    """[K, K] confusion counts -> {"mIoU", "mAcc", "aAcc", "IoU": [...], "Acc": [...], "classes"} (percent)."""
    conf = conf.double()
    inter = conf.diag()
    label = conf.sum(1)
    pred = conf.sum(0)
    union = label + pred - inter
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    iou = torch.where(union > 0, inter / union.clamp(min=1), nan)
    acc = torch.where(label > 0, inter / label.clamp(min=1), nan)

    def nanmean(t: torch.Tensor) -> float:
        ok = ~torch.isnan(t)
        return float(t[ok].mean()) * 100 if ok.any() else math.nan

    total = float(label.sum())
    return {
        "mIoU": nanmean(iou),
        "mAcc": nanmean(acc),
        "aAcc": float(inter.sum()) / total * 100 if total > 0 else math.nan,
        "IoU": [float(v) * 100 for v in iou],
        "Acc": [float(v) * 100 for v in acc],
        "classes": list(class_names) if class_names is not None else [str(i) for i in range(conf.shape[0])],
        "pixels": int(total),
    }


class SegMetric:
    """Accumulates a confusion matrix over batches; :meth:`compute` reduces it across processes.

    >>> m = SegMetric(num_classes=3)
    >>> m.update(pred, target)          # label maps [B, H, W] (or logits [B, K, H, W] as pred)
    >>> m.compute(dist_info)["mIoU"]
    """

    def __init__(self, num_classes: int, ignore_index: int = 255, class_names: Optional[Sequence[str]] = None):
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.num_classes, self.ignore_index = num_classes, ignore_index
        self.class_names = class_names
        self.conf = torch.zeros(num_classes, num_classes, dtype=torch.int64)

    def reset(self) -> None:
        self.conf.zero_()

    def update(self, pred: torch.Tensor, target: torch.Tensor) -> None:
        """pred: label maps [B, H, W] or scores [B, K, H, W] (argmax over K); target: [B, H, W]."""
        if pred.dim() == target.dim() + 1:
            pred = pred.argmax(dim=1)
        self.conf += confusion_matrix(pred, target, self.num_classes, self.ignore_index)

    def compute(self, info=None) -> dict:
        """The metrics over everything seen, summed over ranks when ``info`` (a DistInfo) says so."""
        conf = self.conf.clone()
        if info is not None and getattr(info, "enabled", False):
            from ..runtime.distributed import all_reduce_sum

            all_reduce_sum(conf, info)
        return metrics_from_confusion(conf, self.class_names)
