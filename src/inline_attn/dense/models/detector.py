"""A one-stage, anchor-free detector on InLine backbones: FCOS (Tian et al., ICCV 2019).

Backbone (:class:`~inline_attn.dense.DenseBackbone`, maps at strides 4-32) -> :class:`~inline_attn.dense.FPN`
neck -> a head shared over the levels: two towers of ``num_convs`` conv3x3-GroupNorm-ReLU, one
ending in per-class logits, the other in the four box distances (``exp(scale_l * x)`` in units
of the level's stride, a learnt scale per level, as the original FCOS: every point starts with
a box of 2 strides a side, so the GIoU loss has a gradient from the first step) and a
centerness logit.

Training targets (per point p of level l, stride s, centre ``((j + 0.5) s, (i + 0.5) s)``): the
smallest-area ground-truth box that (a) holds p inside its centre region (the box intersected
with a square of side ``2 * center_radius * s`` around its centre) and (b) whose largest
distance from p lies in the level's range ``[m s_{l-1}, m s_l)`` (``m = range_scale``; first
level from 0, last to infinity). Losses: sigmoid focal over every point and class / positives;
GIoU on positives weighted by their centerness target ``sqrt(min(l, r) / max(l, r) * min(t, b)
/ max(t, b))`` / its sum; binary cross-entropy of the centerness / positives.

Inference: score ``sqrt(sigmoid(cls) * sigmoid(centerness))``; per level the ``pre_nms`` best
points above ``score_threshold``; boxes decoded, clipped to the image, class-aware NMS, at most
``max_per_image`` detections.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...runtime.finite import require_finite
from .backbone import DenseBackbone
from .boxes import clean_targets, decode_ltrb, encode_ltrb, select_detections
from .heads import FPN
from .losses import giou_loss, sigmoid_focal_loss

__all__ = ["FCOS", "FCOSHead", "build_detector", "level_points"]


def _tower(c_in: int, channels: int, n: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for k in range(n):
        layers += [
            nn.Conv2d(c_in if k == 0 else channels, channels, 3, padding=1, bias=False),
            # up to 32 groups (FCOS) of >= 2 channels: a 1 x 1 map (a 32 px image) still normalises
            nn.GroupNorm(math.gcd(32, max(1, channels // 2)), channels),
            nn.ReLU(inplace=True),
        ]
    return nn.Sequential(*layers)


class FCOSHead(nn.Module):
    """feats: L maps [B, C, H_l, W_l] -> per level (cls logits [B, K, H_l, W_l], distances
    [B, 4, H_l, W_l] in stride units (> 0), centerness logits [B, 1, H_l, W_l])."""

    def __init__(self, num_classes: int, in_channels: int, num_levels: int, channels: int = 256, num_convs: int = 4):
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes={num_classes}: a detector needs at least one class")
        self.num_classes = num_classes
        self.cls_tower = _tower(in_channels, channels, num_convs)
        self.reg_tower = _tower(in_channels, channels, num_convs)
        c = channels if num_convs else in_channels
        self.cls_logits = nn.Conv2d(c, num_classes, 3, padding=1)
        self.bbox_pred = nn.Conv2d(c, 4, 3, padding=1)
        self.centerness = nn.Conv2d(c, 1, 3, padding=1)
        self.scales = nn.Parameter(torch.ones(num_levels))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, std=0.01)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        # prior probability 0.01 for every class at start (Lin et al. 2017, Sec. 4.1): the focal
        # loss of the many background points does not swamp the first steps
        nn.init.constant_(self.cls_logits.bias, -math.log((1 - 0.01) / 0.01))

    def forward(self, feats: Sequence[torch.Tensor]):
        out = []
        for lvl, f in enumerate(feats):
            c, r = self.cls_tower(f), self.reg_tower(f)
            # exp of a clamped logit: a diverging step cannot give infinite boxes
            dist = torch.exp((self.scales[lvl] * self.bbox_pred(r)).clamp(max=12.0))
            out.append((self.cls_logits(c), dist, self.centerness(r)))
        return out


def level_points(sizes: Sequence[Sequence[int]], strides: Sequence[int], device=None, dtype=torch.float32):
    """Centres of every level's cells, row-major: list of [H_l * W_l, 2] (x, y) in pixels."""
    pts = []
    for (h, w), s in zip(sizes, strides):
        ys = (torch.arange(h, device=device, dtype=dtype) + 0.5) * s
        xs = (torch.arange(w, device=device, dtype=dtype) + 0.5) * s
        yy, xx = torch.meshgrid(ys, xs, indexing="ij")
        pts.append(torch.stack([xx.reshape(-1), yy.reshape(-1)], -1))
    return pts


class FCOS(nn.Module):
    """FCOS on a :class:`DenseBackbone`.

    forward(images [B, 3, H, W], targets=None): with ``targets`` (a list of B dicts with
    ``boxes`` [N, 4] x1 y1 x2 y2 in pixels and ``labels`` [N] in 0..K-1) the loss dict
    ``{"loss", "loss_cls", "loss_box", "loss_ctr"}``; without, :meth:`predict`'s detections.
    Any H, W: the batch is padded (right, bottom) to a multiple of ``size_divisor``.
    """

    def __init__(
        self,
        backbone: DenseBackbone,
        num_classes: int,
        *,
        neck_channels: int = 256,
        head_channels: Optional[int] = None,
        num_convs: int = 4,
        range_scale: float = 8.0,
        center_radius: float = 1.5,
        focal_alpha: float = 0.25,
        focal_gamma: float = 2.0,
        score_threshold: float = 0.05,
        pre_nms: int = 1000,
        nms_iou: float = 0.6,
        max_per_image: int = 100,
        size_divisor: int = 32,
    ):
        super().__init__()
        self.backbone = backbone
        self.strides = list(backbone.strides)
        self.neck = FPN(backbone.out_channels, neck_channels)
        self.head = FCOSHead(num_classes, neck_channels, len(self.strides), head_channels or neck_channels, num_convs)
        self.num_classes = num_classes
        bounds = [0.0] + [range_scale * s for s in self.strides[:-1]] + [math.inf]
        self.ranges = list(zip(bounds[:-1], bounds[1:]))
        self.center_radius, self.focal_alpha, self.focal_gamma = center_radius, focal_alpha, focal_gamma
        self.score_threshold, self.pre_nms, self.nms_iou = score_threshold, pre_nms, nms_iou
        self.max_per_image, self.size_divisor = max_per_image, size_divisor

    def no_weight_decay(self) -> set[str]:
        inner = self.backbone.no_weight_decay() if hasattr(self.backbone, "no_weight_decay") else set()
        return {"backbone." + n for n in inner}

    def _outputs(self, x: torch.Tensor):
        if x.dim() != 4:
            raise ValueError(f"expected images [B, C, H, W], got shape {tuple(x.shape)}")
        d = self.size_divisor
        ph, pw = (-x.shape[2]) % d, (-x.shape[3]) % d
        x = F.pad(x, (0, pw, 0, ph)) if ph or pw else x
        outs = self.head(self.neck(self.backbone(x)))
        pts = level_points([o[0].shape[-2:] for o in outs], self.strides, x.device)
        return outs, pts

    def forward(self, x: torch.Tensor, targets: Optional[list] = None):
        return self.predict(x) if targets is None else self.loss(x, targets)

    # ---- training ----------------------------------------------------------------------------

    @torch.no_grad()
    def assign(self, points: list[torch.Tensor], boxes: torch.Tensor, labels: torch.Tensor):
        """One image's targets. points: per level [P_l, 2]; boxes [G, 4], labels [G].
        Returns (labels [P] with K = background, boxes [P, 4] of each point's object)."""
        pts = torch.cat(points)
        n = pts.shape[0]
        if boxes.shape[0] == 0:
            return torch.full((n,), self.num_classes, dtype=torch.long, device=pts.device), pts.new_zeros(n, 4)
        stride = torch.cat([torch.full((len(p),), float(s), device=pts.device) for p, s in zip(points, self.strides)])
        lo = torch.cat([torch.full((len(p),), r[0], device=pts.device) for p, r in zip(points, self.ranges)])
        hi = torch.cat([torch.full((len(p),), r[1], device=pts.device) for p, r in zip(points, self.ranges)])
        g = boxes.shape[0]
        b = boxes.to(pts.dtype)
        dist = encode_ltrb(pts.repeat_interleave(g, 0), b.repeat(n, 1)).view(n, g, 4)
        centre = (b[:, :2] + b[:, 2:]) / 2  # [G, 2]
        r = self.center_radius * stride[:, None, None]  # [P, 1, 1]
        region = torch.cat([torch.maximum(b[None, :, :2], centre - r), torch.minimum(b[None, :, 2:], centre + r)], -1)
        inside = encode_ltrb(pts.repeat_interleave(g, 0), region.reshape(-1, 4)).view(n, g, 4).min(-1).values > 0
        reach = dist.max(-1).values
        fits = (reach >= lo[:, None]) & (reach < hi[:, None])
        area = ((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]))[None].expand(n, g)
        area = torch.where(inside & fits, area, torch.full_like(area, math.inf))
        best_area, best = area.min(1)
        lab = torch.where(torch.isfinite(best_area), labels[best], torch.full_like(labels[best], self.num_classes))
        return lab, b[best]

    def loss(self, x: torch.Tensor, targets: list) -> dict[str, torch.Tensor]:
        if len(targets) != x.shape[0]:
            raise ValueError(f"{x.shape[0]} images but {len(targets)} targets")
        size = x.shape[-2:]
        outs, points = self._outputs(x)
        k = self.num_classes
        cls = torch.cat([o[0].flatten(2) for o in outs], 2).transpose(1, 2)  # [B, P, K]
        reg = torch.cat([o[1].flatten(2) for o in outs], 2).transpose(1, 2)  # [B, P, 4] stride units
        ctr = torch.cat([o[2].flatten(2) for o in outs], 2)[:, 0]  # [B, P]
        pts = torch.cat(points)
        stride = torch.cat([torch.full((len(p),), float(s), device=x.device) for p, s in zip(points, self.strides)])
        labs, gts = [], []
        for i, t in enumerate(targets):
            if not isinstance(t, dict) or "boxes" not in t or "labels" not in t:
                raise ValueError(f"target {i}: expected a dict with 'boxes' [N, 4] and 'labels' [N]")
            bx, lb = clean_targets(t["boxes"].to(x.device).float(), t["labels"].to(x.device), size, k, f"target {i}")
            lab, gt = self.assign(points, bx, lb)
            labs.append(lab)
            gts.append(gt)
        lab, gt = torch.stack(labs), torch.stack(gts)  # [B, P], [B, P, 4]
        pos = lab < k
        num_pos = pos.sum().clamp(min=1).float()
        onehot = F.one_hot(lab, k + 1)[..., :k]
        loss_cls = sigmoid_focal_loss(cls, onehot, self.focal_alpha, self.focal_gamma) / num_pos
        if bool(pos.any()):
            p_pts, p_stride = pts.expand(x.shape[0], -1, -1)[pos], stride.expand(x.shape[0], -1)[pos]
            d = encode_ltrb(p_pts, gt[pos]).clamp(min=0)
            lr, tb = d[:, [0, 2]], d[:, [1, 3]]
            ctr_t = torch.sqrt(
                (lr.min(-1).values / lr.max(-1).values.clamp(min=1e-6))
                * (tb.min(-1).values / tb.max(-1).values.clamp(min=1e-6))
            )
            pred_box = decode_ltrb(p_pts, reg[pos].float(), p_stride[:, None])
            loss_box = (giou_loss(pred_box, gt[pos]) * ctr_t).sum() / ctr_t.sum().clamp(min=1e-6)
            loss_ctr = F.binary_cross_entropy_with_logits(ctr[pos].float(), ctr_t, reduction="sum") / num_pos
        else:  # no object in the batch: the box branches get zero (connected) gradients
            loss_box = reg.sum() * 0.0
            loss_ctr = ctr.sum() * 0.0
        return {
            "loss": loss_cls + loss_box + loss_ctr,
            "loss_cls": loss_cls,
            "loss_box": loss_box,
            "loss_ctr": loss_ctr,
        }

    # ---- inference ---------------------------------------------------------------------------

    @torch.no_grad()
    def predict(
        self, x: torch.Tensor, image_sizes: Optional[Sequence[Sequence[int]]] = None, *, source: str = "the model"
    ) -> list[dict]:
        """images [B, 3, H, W] -> B dicts ``{"boxes" [D, 4], "scores" [D], "labels" [D]}`` (pixels
        of the input; ``image_sizes`` (h, w) per image clips to each unpadded image). Non-finite
        head outputs raise :class:`~inline_attn.runtime.finite.NonFiniteOutputs` naming ``source``
        (the score threshold would drop NaN scores: a broken model would detect nothing)."""
        outs, points = self._outputs(x)
        for level in outs:
            for t, what in zip(level, ("class logits", "box regressions", "centre-ness logits")):
                require_finite(t, source, what)
        sizes = image_sizes or [tuple(x.shape[-2:])] * x.shape[0]
        results = []
        for i in range(x.shape[0]):
            boxes, scores, labels = [], [], []
            for (cls, reg, ctr), pts, s in zip(outs, points, self.strides):
                score = torch.sqrt(torch.sigmoid(cls[i].float()) * torch.sigmoid(ctr[i].float())).flatten(1).T
                flat = score.reshape(-1)
                cand = torch.nonzero(flat > self.score_threshold).squeeze(1)
                if cand.numel() > self.pre_nms:
                    cand = cand[flat[cand].topk(self.pre_nms).indices]
                p, c = cand // self.num_classes, cand % self.num_classes
                boxes.append(decode_ltrb(pts[p], reg[i].float().flatten(1).T[p], s))
                scores.append(flat[cand])
                labels.append(c)
            results.append(
                select_detections(
                    torch.cat(boxes),
                    torch.cat(scores),
                    torch.cat(labels),
                    iou_threshold=self.nms_iou,
                    max_per_image=self.max_per_image,
                    image_size=sizes[i],
                )
            )
        return results


def build_detector(backbone: str, num_classes: int, *, backbone_kwargs: Optional[dict] = None, **kwargs) -> FCOS:
    """FCOS on the registered model ``backbone`` (``backbone_kwargs`` to :class:`DenseBackbone`);
    ``kwargs`` to :class:`FCOS`."""
    return FCOS(DenseBackbone(backbone, **(backbone_kwargs or {})), num_classes, **kwargs)
