"""Mixup / CutMix with soft targets and label smoothing (timm's 'batch' mode, written here).

kornia's RandomMixUpV2/RandomCutMixV2 return label triples whose lambda means different things
in the two ops; building the soft targets here keeps one meaning: ``lam`` is the weight of the
original sample, ``1 - lam`` of its partner in the flipped batch.
"""

from __future__ import annotations

import math

import torch


def smooth_one_hot(y: torch.Tensor, num_classes: int, smoothing: float = 0.0) -> torch.Tensor:
    """y: [B] int -> [B, num_classes] with ``1 - smoothing + smoothing/K`` on the class, ``smoothing/K`` elsewhere."""
    off = smoothing / num_classes
    t = torch.full((y.shape[0], num_classes), off, device=y.device)
    return t.scatter_(1, y.view(-1, 1), 1.0 - smoothing + off)


def cutmix_box(H: int, W: int, lam: float) -> tuple[int, int, int, int]:
    """A box covering about ``1 - lam`` of the image, centred uniformly and clipped: (y0, y1, x0, x1)."""
    cut = math.sqrt(1.0 - lam)
    ch, cw = int(H * cut), int(W * cut)
    cy = int(torch.randint(0, H, ()).item())
    cx = int(torch.randint(0, W, ()).item())
    y0, y1 = max(cy - ch // 2, 0), min(cy + ch // 2, H)
    x0, x1 = max(cx - cw // 2, 0), min(cx + cw // 2, W)
    return y0, y1, x0, x1


class Mixup:
    """Mix a batch with its reverse: mixup (Beta(mixup_alpha)) or cutmix (Beta(cutmix_alpha)).

    With both alphas > 0, cutmix is chosen with probability ``switch_prob``; the batch is mixed
    with probability ``prob``. ``__call__(x [B,C,H,W], y [B]) -> (x, targets [B, K])``. Random
    draws use torch's global generator (saved in checkpoints, so resumes are exact).
    """

    def __init__(
        self,
        num_classes: int,
        mixup_alpha: float = 0.8,
        cutmix_alpha: float = 1.0,
        prob: float = 1.0,
        switch_prob: float = 0.5,
        label_smoothing: float = 0.1,
    ):
        if mixup_alpha < 0 or cutmix_alpha < 0 or not 0 <= prob <= 1 or not 0 <= switch_prob <= 1:
            raise ValueError(
                f"bad mixup settings: mixup_alpha={mixup_alpha}, cutmix_alpha={cutmix_alpha}, "
                f"prob={prob}, switch_prob={switch_prob}"
            )
        self.num_classes = num_classes
        self.mixup_alpha = mixup_alpha
        self.cutmix_alpha = cutmix_alpha
        self.prob = prob
        self.switch_prob = switch_prob
        self.label_smoothing = label_smoothing

    @property
    def active(self) -> bool:
        return self.prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)

    def sample(self) -> tuple[float, bool]:
        """(lam, use_cutmix) for one batch."""
        if not self.active or torch.rand(()).item() >= self.prob:
            return 1.0, False
        use_cutmix = self.cutmix_alpha > 0 and (self.mixup_alpha <= 0 or torch.rand(()).item() < self.switch_prob)
        alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
        lam = float(torch.distributions.Beta(alpha, alpha).sample().item())
        return lam, use_cutmix

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, y: torch.Tensor):
        lam, use_cutmix = self.sample()
        if lam < 1.0:
            if use_cutmix:
                H, W = x.shape[-2:]
                y0, y1, x0, x1 = cutmix_box(H, W, lam)
                x = x.clone()
                x[..., y0:y1, x0:x1] = x.flip(0)[..., y0:y1, x0:x1]
                lam = 1.0 - (y1 - y0) * (x1 - x0) / float(H * W)  # the area actually pasted
            else:
                x = x * lam + x.flip(0) * (1.0 - lam)
        t = smooth_one_hot(y, self.num_classes, self.label_smoothing)
        return x, t * lam + t.flip(0) * (1.0 - lam)
