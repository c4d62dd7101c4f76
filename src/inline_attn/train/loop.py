"""One training epoch and one evaluation pass (any number of processes)."""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..runtime.amp import autocast
from ..runtime.distributed import DistInfo, all_reduce_sum
from ..runtime.finite import require_finite
from ..runtime.loop import backward, check_finite, optimizer_step, stop_everywhere
from .data import Batches
from .graphs import StepGraphs
from .state import TrainState

__all__ = ["EpochRunner", "accuracy_counts", "evaluate", "soft_cross_entropy"]


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


@dataclass
class EpochRunner:
    """What every training step needs and the run does not change."""

    model: nn.Module  # the model to call (DDP-wrapped when distributed)
    batches: Batches
    train_aug: nn.Module
    mixup: Callable
    device: torch.device
    info: DistInfo
    amp: str
    accum: int
    clip_grad: Optional[float]
    steps_per_epoch: int
    channels_last: bool = False
    total_epochs: int = 1
    max_steps: int = 0
    progress: bool = False
    graphs: Optional[StepGraphs] = None  # train.cuda_graphs on: the steps are captured and replayed

    def run(self, state: TrainState, stop_requested: Callable[[], bool]) -> tuple[Optional[str], int]:
        """Optimizer steps ``state.step_in_epoch`` .. the end of epoch ``state.epoch``.

        Stops early after a step when ``stop_requested()`` on any rank ("signal") or at
        ``max_steps`` ("max_steps"); returns (that reason or None, images this rank trained on).
        """
        self.model.train()
        seen = 0
        pbar = self._progress_bar(state)
        it = self.batches.iterate(state.epoch, state.step_in_epoch * self.accum)
        try:
            for s in range(state.step_in_epoch, self.steps_per_epoch):
                t_step = time.time()
                step_loss = self._step(state, it)
                state.step += 1
                state.step_in_epoch = s + 1
                state.partial += step_loss
                seen += int(step_loss[1])
                if pbar is not None:
                    ips = step_loss[1].item() * self.info.world_size / max(time.time() - t_step, 1e-9)
                    pbar.set_postfix(
                        loss=f"{step_loss[0].item() / step_loss[1].item():.4f}",
                        lr=f"{state.lr:.2e}",
                        img_s=f"{ips:.0f}",
                        refresh=False,
                    )
                    pbar.update(1)
                if stop_everywhere(stop_requested(), self.info):
                    return "signal", seen
                if self.max_steps and state.step >= self.max_steps:
                    return "max_steps", seen
            return None, seen
        finally:
            if pbar is not None:
                pbar.close()

    def _batch(self, it) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next batch on the device, augmented and mixed: (images, soft targets, labels)."""
        x, y = next(it)
        x = self.train_aug(x.to(self.device, non_blocking=True))
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        y = y.to(self.device, non_blocking=True)
        x, target = self.mixup(x, y)
        return x, target, y

    def _step(self, state: TrainState, it) -> torch.Tensor:
        """One optimizer step over ``accum`` micro-batches; returns [loss sum, samples]."""
        if self.graphs is not None:
            return self._graphed_step(state, it)
        state.optimizer.zero_grad(set_to_none=True)
        step_loss = torch.zeros(2, dtype=torch.float64)
        for m in range(self.accum):
            x, target, y = self._batch(it)
            sync = m == self.accum - 1 or not self.info.enabled
            with contextlib.nullcontext() if sync else self.model.no_sync():
                with autocast(self.device, self.amp):
                    logits = self.model(x)
                loss = soft_cross_entropy(logits, target)
                check_finite(loss, f"epoch {state.epoch}, step {state.step}")
                backward(loss / self.accum, state.scaler)
            step_loss += torch.tensor([loss.item() * y.numel(), y.numel()], dtype=torch.float64)
        optimizer_step(state.model.parameters(), state.optimizer, state.scaler, self.clip_grad)
        state.sched.step()
        if state.ema is not None:
            state.ema.update(state.model)
        return step_loss

    def _graphed_step(self, state: TrainState, it) -> torch.Tensor:
        """:meth:`_step` through :attr:`graphs` (one micro-batch, no scaler): the step with its EMA
        update replayed, the loss read after it, then the schedule written into the tensor lr."""
        x, target, y = self._batch(it)
        loss = self.graphs.train_step(state, self.model, soft_cross_entropy, x, target)
        check_finite(loss, f"epoch {state.epoch}, step {state.step}")
        step_loss = torch.tensor([loss.item() * y.numel(), y.numel()], dtype=torch.float64)
        state.sched.step()
        return step_loss

    def _progress_bar(self, state: TrainState):
        if not (self.progress and self.info.is_main):
            return None
        from tqdm import tqdm

        return tqdm(
            total=self.steps_per_epoch,
            initial=state.step_in_epoch,
            desc=f"epoch {state.epoch + 1}/{self.total_epochs}",
            dynamic_ncols=True,
            mininterval=1.0,
            file=sys.stderr,
            leave=False,
        )
