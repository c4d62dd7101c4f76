"""``train.cuda_graphs``: the classification trainer's steps captured in CUDA graphs and replayed.

A small model's GPU step is bound by the host (issue 23): the GPU idles while Python launches
the step's many small kernels. With ``train.cuda_graphs`` on, the trainer captures its training
step (forward under autocast, the soft-target loss, backward, gradient clipping, the optimizer
step, the EMA update) once, at the first batch, and replays it for every batch of that shape; the
evaluation forward of the model and of its EMA is captured the same way. What stays outside the
graph, on the host or as ordinary launches: loading, the on-device augmentation and mixup (their
random draws), the loss read for the logs, the learning-rate schedule (written in place into the
optimizer's tensor lr after each replay: :func:`inline_attn.runtime.optim.set_lr`), checkpoints.

:func:`plan` decides, once per run, from the setting (``auto`` | true | false) and the run:

- not CUDA, more than one process (DDP), gradient accumulation > 1, fp16 (its GradScaler reads the
  inf check on the host) or a per-step Python hook: no graphs, with a one-line reason (printed
  when ``true`` asked for them, and for ``auto`` on CUDA; ``auto`` on the CPU is silent, so a CPU
  run prints and computes exactly what it did before the setting existed);
- with ``train.compile``: inductor's ``reduce-overhead`` mode (:func:`inline_attn.runtime.graphs.compile_mode_for`)
  instead of the manual capture.

Numerics: a graphed run is the same computation, but the optimizer is made capturable
(:func:`~inline_attn.runtime.optim.prepare_for_capture`: AdamW's bias corrections and the lr in
float32 device arithmetic, SGD fused), and the warm-up before capture draws from the CUDA
generator (stochastic depth), so its losses are close to, not bitwise equal to, the ungraphed run's.
Checkpoints store the optimizer in its plain form (:func:`~inline_attn.runtime.optim.plain_state_dict`),
so a run may resume with or without graphs.

Validated where: the CPU tests run all of this host logic with the capture replaced by eager
execution (``capture_fn``); the capture and replay themselves only run on a GPU, in ``make
gpu-check`` (its on-demand ``train`` step, ``--steps train``, compares a graphed bf16 run's losses
with the ungraphed run's).
"""

from __future__ import annotations

import logging
import sys
from typing import Callable, Optional, Union

import torch
import torch.nn as nn

from ..runtime.graphs import GraphedEvalStep, GraphedTrainStep, capture, why_not_graphed
from ..runtime.optim import capture_unsupported, prepare_for_capture
from .state import TrainState

log = logging.getLogger(__name__)

Setting = Union[str, bool]  # "auto" | True | False (train.cuda_graphs)
AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def plan(
    setting: Setting,
    device: torch.device,
    *,
    amp: str,
    accum_steps: int,
    world_size: int,
    compile: bool,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
) -> tuple[bool, Optional[str]]:
    """(graph the steps?, why not or None) for ``train.cuda_graphs`` = ``setting`` on this run.

    ``false`` gives (False, None). Otherwise the run's reason not to capture, if any: with
    ``compile``, only the device and the process count count (inductor's reduce-overhead mode
    decides the rest itself); without, every condition of :func:`why_not_graphed` and an
    optimizer that :func:`prepare_for_capture` cannot prepare."""
    if setting is False:
        return False, None
    if compile:
        reason = why_not_graphed(device, world_size=world_size)
    else:
        reason = why_not_graphed(device, model=model, amp=amp, accum_steps=accum_steps, world_size=world_size)
        reason = reason or capture_unsupported(optimizer)
    return reason is None, reason


def announce(
    setting: Setting, graphed: bool, reason: Optional[str], device: torch.device, compile: bool
) -> Optional[str]:
    """The run's one line about CUDA graphs, or None where it says nothing (off, or ``auto`` off
    the GPU)."""
    if graphed:
        how = "torch.compile mode reduce-overhead" if compile else "training and evaluation steps captured"
        return f"train.cuda_graphs={_shown(setting)}: on ({how})"
    if reason is None or (setting == "auto" and device.type != "cuda"):
        return None
    return f"train.cuda_graphs={_shown(setting)}: running ungraphed: {reason}"


def _shown(setting: Setting) -> str:
    return str(setting).lower() if isinstance(setting, bool) else str(setting)


def capture_beside_loader(fn: Callable[[], object], *, warmup: int = 3, pool=None):
    """:func:`inline_attn.runtime.graphs.capture` in the ``thread_local`` error mode: the loader's
    pin-memory thread may allocate page-locked memory while the step is captured (in the default
    ``global`` mode that call would fail and void the capture)."""
    return capture(fn, warmup=warmup, pool=pool, capture_error_mode="thread_local")


class StepGraphs:
    """The CUDA graphs of one run's steps, each captured lazily at its first batch.

    :meth:`train_step` runs one training step through a :class:`~inline_attn.runtime.graphs.GraphedTrainStep`
    (static input buffers, the batch copied in, replayed; a batch of another shape runs the
    plain step on the same state); :meth:`eval_forward` gives a model's evaluation forward
    through a :class:`~inline_attn.runtime.graphs.GraphedEvalStep`. ``capture_fn`` is
    :func:`capture_beside_loader`; the CPU tests pass :func:`~inline_attn.runtime.graphs.eager_capture`.
    """

    def __init__(
        self, amp: str, clip_grad: Optional[float], *, capture_fn: Callable = capture_beside_loader, warmup: int = 3
    ):
        self.amp, self.clip_grad, self.capture_fn, self.warmup = AMP_DTYPES[amp], clip_grad, capture_fn, warmup
        self.train: Optional[GraphedTrainStep] = None
        self.evals: dict[int, GraphedEvalStep] = {}

    def train_step(
        self,
        state: TrainState,
        model: nn.Module,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        inputs: torch.Tensor,
        targets: torch.Tensor,
    ) -> torch.Tensor:
        """One optimizer step of ``model`` on (inputs, targets), EMA included -> the loss (a static
        tensor when replayed: read it before the next step). The schedule is the caller's."""
        if self.train is None:
            prepare_for_capture(state.optimizer)
            self.train = GraphedTrainStep(
                model,
                state.optimizer,
                loss_fn,
                inputs,
                targets,
                ema=state.ema,
                amp=self.amp,
                clip_grad=self.clip_grad,
                warmup=self.warmup,
                why_not=None,
                capture_fn=self.capture_fn,
            )
            if self.train.why_not is not None:
                print(f"train.cuda_graphs: running ungraphed: {self.train.why_not}", file=sys.stderr, flush=True)
        return self.train(inputs, targets)

    def eval_forward(self, model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        """``model``'s evaluation forward (fp32, no grad), captured at its first batch."""

        def forward(inputs: torch.Tensor) -> torch.Tensor:
            step = self.evals.get(id(model))
            if step is None or step.model is not model:
                step = GraphedEvalStep(model, inputs, warmup=2, why_not=None, capture_fn=self.capture_fn)
                if step.why_not is not None:
                    log.warning("evaluation runs ungraphed: %s", step.why_not)
                self.evals[id(model)] = step
            return step(inputs)

        return forward

    def counts(self) -> dict:
        """Replays and ungraphed steps so far, for the run's summary."""
        out = {"train_replays": 0, "train_ungraphed": 0, "eval_replays": 0, "eval_ungraphed": 0}
        if self.train is not None:
            out.update(train_replays=self.train.replays, train_ungraphed=self.train.ungraphed_steps)
            out["train_why_not"] = self.train.why_not
        for step in self.evals.values():
            out["eval_replays"] += step.replays
            out["eval_ungraphed"] += step.ungraphed_steps
        return out
