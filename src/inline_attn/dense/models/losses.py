"""Dense losses: the segmentation cross-entropy with an ignore label (mmseg's CrossEntropyLoss)
and the segmentor's loss over its heads (:class:`SegLoss`); the detector's sigmoid focal loss
(Lin et al. 2017, Eq. 5) and GIoU loss (Rezatofighi et al. 2019)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["SegLoss", "check_labels", "giou_loss", "seg_cross_entropy", "sigmoid_focal_loss"]


def check_labels(target: torch.Tensor, num_classes: int, ignore_index: int = 255, where: str = "labels") -> None:
    """Raise ValueError when ``target`` holds a value outside [0, num_classes) other than ``ignore_index``."""
    bad = (target != ignore_index) & ((target < 0) | (target >= num_classes))
    if bool(bad.any()):
        vals = sorted(set(torch.unique(target[bad]).tolist()))[:10]
        raise ValueError(
            f"{where} hold values {vals} outside the {num_classes} classes "
            f"(0..{num_classes - 1}, or {ignore_index} for 'ignore')"
        )


def seg_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = 255,
    num_classes: int | None = None,
    *,
    avg_non_ignore: bool = False,
    check: bool = True,
) -> torch.Tensor:
    """Mean per-pixel cross-entropy.

    logits: [B, K, H, W]; target: [B, H, W] integer labels in [0, K) or ``ignore_index``.
    Ignored pixels contribute 0. The mean divides by every pixel (mmseg's default,
    ``avg_non_ignore=False``) or by the non-ignored pixels only (``avg_non_ignore=True``; the
    count stays on the device). Computed in float32 under autocast. ``check``: the labels'
    range is checked (:func:`check_labels`, a ValueError naming the values); that reads a flag on
    the host, so a step captured in a CUDA graph passes False and relies on the data sets,
    which check their labels when they read them.
    """
    if (
        logits.dim() != 4
        or target.dim() != 3
        or logits.shape[0] != target.shape[0]
        or logits.shape[-2:] != target.shape[-2:]
    ):
        raise ValueError(
            f"logits {tuple(logits.shape)} must be [B, K, H, W] and labels {tuple(target.shape)} "
            f"[B, H, W] of the same size"
        )
    if check:
        check_labels(target, num_classes or logits.shape[1], ignore_index)
    loss = F.cross_entropy(logits.float(), target.long(), ignore_index=ignore_index, reduction="none")
    if avg_non_ignore:
        return loss.sum() / (target != ignore_index).sum().clamp(min=1)
    return loss.mean()


class SegLoss:
    """The segmentor's training loss (mmseg's decode head + auxiliary head):
    ``loss = CE(decode) + aux_weight * CE(aux)`` with :func:`seg_cross_entropy` of each head's
    logits upsampled to the labels, the auxiliary term only where the model has that head.

    :meth:`terms` gives every term (``loss_decode``, ``loss_aux`` where there is one, ``loss``);
    calling it gives them with ``loss`` first (the one minimised) and without the host check of
    the labels, so a training step that calls it can be captured in a CUDA graph (no host read, no
    shape that depends on the data).
    """

    def __init__(
        self, num_classes: int, ignore_index: int = 255, aux_weight: float = 0.0, avg_non_ignore: bool = False
    ):
        self.num_classes, self.ignore_index = int(num_classes), int(ignore_index)
        self.aux_weight, self.avg_non_ignore = float(aux_weight), bool(avg_non_ignore)

    def terms(self, logits, target: torch.Tensor, *, check: bool = True) -> dict[str, torch.Tensor]:
        """logits: (decode [B, K, H, W], auxiliary [B, K, H, W] or None); target: labels [B, H, W]
        -> ``{"loss_decode", ["loss_aux"], "loss"}``; ``check`` as :func:`seg_cross_entropy`'s."""
        decode, aux = logits
        kw = dict(avg_non_ignore=self.avg_non_ignore, check=check)
        out = {"loss_decode": seg_cross_entropy(decode, target, self.ignore_index, self.num_classes, **kw)}
        total = out["loss_decode"]
        if aux is not None:
            out["loss_aux"] = seg_cross_entropy(aux, target, self.ignore_index, self.num_classes, **kw)
            total = total + self.aux_weight * out["loss_aux"]
        out["loss"] = total
        return out

    def __call__(self, logits, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{"loss", "loss_decode", ["loss_aux"]}`` (0-dim each), capture-safe: the labels are not
        checked on the host."""
        terms = self.terms(logits, target, check=False)
        return {"loss": terms["loss"], **terms}


def sigmoid_focal_loss(logits: torch.Tensor, targets: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0):
    """Element-wise focal loss (Lin et al. 2017, Eq. 5), summed: ``-a_t (1 - p_t)^gamma log p_t``
    with ``p = sigmoid(logits)``, ``p_t = p`` where the target is 1 and ``1 - p`` where it is 0,
    ``a_t = alpha`` / ``1 - alpha`` likewise (``alpha < 0``: no weighting).

    logits, targets: same shape ([P, K] points x classes; targets 0 / 1). Returns a scalar
    (the sum; the detector divides by its number of positive points). Computed in float32 (or
    the input's float64) through ``binary_cross_entropy_with_logits`` for a stable log.
    """
    if logits.shape != targets.shape:
        raise ValueError(f"focal loss: logits {tuple(logits.shape)} and targets {tuple(targets.shape)} differ")
    x = logits if logits.dtype == torch.float64 else logits.float()
    t = targets.to(x.dtype)
    p = torch.sigmoid(x)
    ce = F.binary_cross_entropy_with_logits(x, t, reduction="none")
    p_t = p * t + (1 - p) * (1 - t)
    loss = ce * (1 - p_t) ** gamma
    if alpha >= 0:
        loss = (alpha * t + (1 - alpha) * (1 - t)) * loss
    return loss.sum()


def giou_loss(pred: torch.Tensor, target: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Per-box ``1 - GIoU`` (Rezatofighi et al. 2019, Alg. 1): ``GIoU = IoU - |C \\ (A u B)| / |C|``
    with C the smallest box enclosing both. pred, target: [N, 4] (x1, y1, x2, y2) -> [N] in
    [0, 2]; ``eps`` keeps empty unions and hulls finite (a predicted box may be empty)."""
    if pred.shape != target.shape or pred.shape[-1:] != (4,):
        raise ValueError(f"GIoU loss: boxes {tuple(pred.shape)} and {tuple(target.shape)} must both be [N, 4]")
    area_p = (pred[:, 2] - pred[:, 0]).clamp(min=0) * (pred[:, 3] - pred[:, 1]).clamp(min=0)
    area_t = (target[:, 2] - target[:, 0]).clamp(min=0) * (target[:, 3] - target[:, 1]).clamp(min=0)
    wh = (torch.minimum(pred[:, 2:], target[:, 2:]) - torch.maximum(pred[:, :2], target[:, :2])).clamp(min=0)
    inter = wh[:, 0] * wh[:, 1]
    union = area_p + area_t - inter
    iou = inter / (union + eps)
    hull_wh = (torch.maximum(pred[:, 2:], target[:, 2:]) - torch.minimum(pred[:, :2], target[:, :2])).clamp(min=0)
    hull = hull_wh[:, 0] * hull_wh[:, 1]
    return 1 - (iou - (hull - union) / (hull + eps))
