"""Classification's loss and one evaluation pass (any number of processes)."""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..runtime.amp import autocast
from ..runtime.distributed import DistInfo, all_reduce_sum
from ..runtime.finite import require_finite
from .data import Batches

__all__ = ["accuracy_counts", "evaluate", "soft_cross_entropy"]


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """logits: [B, K], target: [B, K] probabilities -> mean over the batch of -sum t log p."""
    return torch.sum(-target * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()


def accuracy_counts(logits: torch.Tensor, target: torch.Tensor, topk=(1, 5)) -> list[int]:
    """Number of samples whose label is among the top-k logits, for each k (k capped at K)."""
    maxk = min(max(topk), logits.shape[-1])
    pred = logits.topk(maxk, dim=-1).indices  # [B, maxk]
    hit = pred.eq(target.view(-1, 1))
    return [int(hit[:, : min(k, maxk)].any(dim=1).sum()) for k in topk]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Batches,
    transform: nn.Module,
    device: torch.device,
    info: Optional[DistInfo] = None,
    amp: str = "none",
    forward: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    source: str = "the model",
) -> dict:
    """Top-1 / top-5 accuracy (%) and mean cross-entropy over the readable samples, summed across
    ranks; ``n`` counts the images scored and ``n_unreadable`` the ones that could not be read.
    ``forward``: what computes the logits of a batch instead of ``model(x)`` (a CUDA-graphed
    forward of ``model``, :meth:`inline_attn.train.graphs.StepGraphs.eval_forward`). Non-finite
    logits raise :class:`~inline_attn.runtime.finite.NonFiniteOutputs` naming ``source``."""
    info = info or DistInfo()
    was_training = model.training
    model.eval()
    sums = torch.zeros(5, dtype=torch.float64)  # loss sum, top1, top5, n, unreadable
    for x, y in batches.iterate():
        x = transform(x.to(device, non_blocking=True))
        y = y.to(device)
        with autocast(device, amp):
            logits = model(x) if forward is None else forward(x)
        logits = logits.float()
        require_finite(logits, source, "logits")
        t1, t5 = accuracy_counts(logits, y)
        sums[:4] += torch.tensor(
            [float(F.cross_entropy(logits, y, reduction="sum")), t1, t5, y.numel()], dtype=torch.float64
        )
    sums[4] = batches.unreadable
    model.train(was_training)
    all_reduce_sum(sums, info)
    n = max(sums[3].item(), 1.0)
    return {
        "loss": sums[0].item() / n,
        "top1": 100.0 * sums[1].item() / n,
        "top5": 100.0 * sums[2].item() / n,
        "n": int(sums[3].item()),
        "n_unreadable": int(sums[4].item()),
    }
