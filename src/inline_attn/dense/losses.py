"""The segmentation loss: per-pixel cross-entropy with an ignore label (mmseg's CrossEntropyLoss)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["check_labels", "seg_cross_entropy"]


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
) -> torch.Tensor:
    """Mean per-pixel cross-entropy.

    logits: [B, K, H, W]; target: [B, H, W] integer labels in [0, K) or ``ignore_index``.
    Ignored pixels contribute 0. The mean divides by every pixel (mmseg's default,
    ``avg_non_ignore=False``) or by the non-ignored pixels only (``avg_non_ignore=True``).
    Computed in float32 under autocast.
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
    check_labels(target, num_classes or logits.shape[1], ignore_index)
    loss = F.cross_entropy(logits.float(), target.long(), ignore_index=ignore_index, reduction="none")
    if avg_non_ignore:
        return loss.sum() / (target != ignore_index).sum().clamp(min=1)
    return loss.mean()
