"""Box operations for detection, pure PyTorch (torchvision cannot be imported with the CPU torch build).

Boxes are ``[x1, y1, x2, y2]`` in pixels (x2, y2 exclusive, as the mosaics' boxes), float tensors
``[N, 4]``. FCOS (Tian et al. 2019) codes a box seen from a point ``(px, py)`` as its four distances
``(l, t, r, b) = (px - x1, py - y1, x2 - px, y2 - py)``, divided by the level's stride.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

__all__ = [
    "batched_nms",
    "box_area",
    "box_iou",
    "check_boxes",
    "clean_targets",
    "clip_boxes",
    "decode_ltrb",
    "encode_ltrb",
    "nms",
    "select_detections",
]


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    """boxes [N, 4] -> areas [N] (0 for empty boxes)."""
    return (boxes[:, 2] - boxes[:, 0]).clamp(min=0) * (boxes[:, 3] - boxes[:, 1]).clamp(min=0)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [N, 4], b [M, 4] -> IoU [N, M] (0 where both boxes are empty)."""
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    union = box_area(a)[:, None] + box_area(b)[None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=torch.finfo(union.dtype).tiny), torch.zeros_like(inter))


def check_boxes(boxes: torch.Tensor, where: str = "boxes") -> None:
    """ValueError unless ``boxes`` is a finite float [N, 4] with x2 >= x1 and y2 >= y1."""
    if boxes.dim() != 2 or boxes.shape[-1] != 4:
        raise ValueError(f"{where}: expected [N, 4] boxes (x1, y1, x2, y2), got shape {tuple(boxes.shape)}")
    if not boxes.is_floating_point():
        raise ValueError(f"{where}: expected a float tensor, got {boxes.dtype}")
    if not bool(torch.isfinite(boxes).all()):
        raise ValueError(f"{where}: {int((~torch.isfinite(boxes)).any(-1).sum())} boxes are not finite")
    bad = (boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])
    if bool(bad.any()):
        raise ValueError(
            f"{where}: {int(bad.sum())} boxes have x2 < x1 or y2 < y1, e.g. {boxes[bad][0].tolist()} "
            f"(expected x1 <= x2, y1 <= y2)"
        )


def clean_targets(
    boxes: torch.Tensor, labels: torch.Tensor, size: Sequence[int], num_classes: int, where: str = "targets"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Training targets made safe for the losses.

    boxes [N, 4], labels [N] (0..num_classes-1), size (H, W) of the image. Boxes are clipped to
    the image; boxes empty after clipping (outside the image, or of zero width or height) are
    dropped, as they cover no point. Malformed input (shape, non-finite, x2 < x1, a label out of
    range) raises ValueError naming it. Returns (boxes [M, 4], labels [M]).
    """
    check_boxes(boxes, where)
    if labels.shape != (boxes.shape[0],):
        raise ValueError(f"{where}: {boxes.shape[0]} boxes but labels of shape {tuple(labels.shape)}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(
            f"{where}: labels {sorted(set(labels.tolist()))} outside 0..{num_classes - 1} ({num_classes} classes)"
        )
    clipped = clip_boxes(boxes, size)
    keep = box_area(clipped) > 0
    return clipped[keep], labels[keep].long()


def clip_boxes(boxes: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """Boxes [N, 4] clipped to an image of ``size`` (H, W)."""
    h, w = float(size[0]), float(size[1])
    return torch.stack(
        [boxes[:, 0].clamp(0, w), boxes[:, 1].clamp(0, h), boxes[:, 2].clamp(0, w), boxes[:, 3].clamp(0, h)], -1
    )


def encode_ltrb(points: torch.Tensor, boxes: torch.Tensor, stride: float = 1.0) -> torch.Tensor:
    """points [P, 2] (x, y), boxes [P, 4] -> distances [P, 4] (l, t, r, b) / stride (negative
    where the point lies outside its box)."""
    x, y = points[:, 0], points[:, 1]
    return torch.stack([x - boxes[:, 0], y - boxes[:, 1], boxes[:, 2] - x, boxes[:, 3] - y], -1) / stride


def decode_ltrb(points: torch.Tensor, dist: torch.Tensor, stride: float = 1.0) -> torch.Tensor:
    """Inverse of :func:`encode_ltrb`: points [..., 2], distances [..., 4] -> boxes [..., 4]."""
    d = dist * stride
    x, y = points[..., 0], points[..., 1]
    return torch.stack([x - d[..., 0], y - d[..., 1], x + d[..., 2], y + d[..., 3]], -1)


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy non-maximum suppression: boxes [N, 4], scores [N] -> kept indices [K] by
    decreasing score. A box is dropped when its IoU with a kept higher-scoring box exceeds
    ``iou_threshold``; equal scores keep the lower index first (a stable sort)."""
    check_boxes(boxes, "nms boxes")
    if scores.shape != (boxes.shape[0],):
        raise ValueError(f"nms: {boxes.shape[0]} boxes but scores of shape {tuple(scores.shape)}")
    if boxes.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=boxes.device)
    order = torch.sort(scores, descending=True, stable=True).indices
    over = box_iou(boxes[order], boxes[order]) > iou_threshold  # [N, N], in score order
    # the greedy pass is sequential (one row per kept box); numpy keeps its per-element cost small
    over = over.cpu().numpy()
    removed = np.zeros(len(order), dtype=bool)
    keep = []
    for i in range(len(order)):
        if removed[i]:
            continue
        keep.append(i)
        removed |= over[i]
    return order[torch.tensor(keep, dtype=torch.long, device=boxes.device)]


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Class-aware NMS: boxes of different ``classes`` [N] never suppress each other. Returns kept
    indices [K] by decreasing score (equal scores: by class, then index). One :func:`nms` per class,
    so the IoU matrices are per class (a detector's thousands of candidates spread over K classes)."""
    if boxes.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=boxes.device)
    keep = []
    for c in torch.unique(classes):
        idx = torch.nonzero(classes == c).squeeze(1)
        keep.append(idx[nms(boxes[idx], scores[idx], iou_threshold)])
    keep = torch.cat(keep)
    return keep[torch.sort(scores[keep], descending=True, stable=True).indices]


def select_detections(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    labels: torch.Tensor,
    *,
    iou_threshold: float,
    max_per_image: int,
    image_size: Optional[Sequence[int]] = None,
) -> dict[str, torch.Tensor]:
    """Candidates of one image -> ``{"boxes", "scores", "labels"}`` after clipping to
    ``image_size`` (H, W), dropping empty boxes, class-aware NMS and the ``max_per_image`` best."""
    if image_size is not None:
        boxes = clip_boxes(boxes, image_size)
    ok = box_area(boxes) > 0
    boxes, scores, labels = boxes[ok], scores[ok], labels[ok]
    keep = batched_nms(boxes, scores, labels, iou_threshold)[:max_per_image]
    return {"boxes": boxes[keep], "scores": scores[keep], "labels": labels[keep]}
