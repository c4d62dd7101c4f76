"""Whole training and evaluation steps captured in CUDA graphs, replayed while shapes stay static.

A small InLine model's GPU step is bound by the host: the GPU idles while Python launches dozens
of small kernels per layer (docs/benchmarks.md; issue 23). A CUDA graph records a whole step's
kernels once and replays them with one launch. Without ``torch.compile`` the step is captured
with ``torch.cuda.graph`` (warm-up on a side stream, then one capture, the pattern of PyTorch's
"whole network capture"); with it, ``mode="reduce-overhead"`` does the same inside inductor
(:func:`compile_mode_for`).

A step can be captured when it runs on CUDA with static shapes and does nothing on the host that
depends on the data: the fused InLine op is capture-safe (no host synchronisation, no
data-dependent allocation, launch shapes decided from the shapes, workspaces from the caching
allocator; ``tests/test_cuda_graphs.py`` checks a step for syncs). What cannot be captured falls
back to the plain step with a one-line reason (:func:`why_not_graphed`, in the spirit of
:func:`inline_attn.ops.why_not_fused`).

Use::

    step = GraphedTrainStep(model, optimizer, loss_fn, example_images, example_targets, ema=ema)
    print(step.why_not)           # None when graphed, else why it runs ungraphed
    loss = step(images, targets)  # copies into the static inputs and replays (or runs the step)
"""

from __future__ import annotations

import copy
from typing import Callable, Optional

import torch
import torch.nn as nn

from .compile import check_compile_mode

__all__ = [
    "GraphedEvalStep",
    "GraphedTrainStep",
    "capture",
    "compile_mode_for",
    "graph_steps",
    "train_step",
    "why_not_graphed",
]


def _hooked_modules(model: nn.Module) -> list[str]:
    """Names of the modules with a Python hook that runs every step (forward or attention hooks)."""
    names = []
    for name, m in model.named_modules():
        if m._forward_hooks or m._forward_pre_hooks or getattr(m, "_attention_hook", None) is not None:
            names.append(name or type(m).__name__)
    return names


def why_not_graphed(
    device: torch.device | str,
    *,
    model: Optional[nn.Module] = None,
    optimizer: Optional[torch.optim.Optimizer] = None,
    static_shapes: bool = True,
    scaler: Optional[torch.amp.GradScaler] = None,
) -> Optional[str]:
    """Why a step on ``device`` cannot be captured in a CUDA graph (one line), or None when it can.

    Args:
        device: where the step runs (CUDA graphs exist on CUDA only).
        model: checked for per-step Python hooks (an attention recorder, a forward hook): a graph
            replays kernels, not Python, so the hook would silently stop running.
        optimizer: must update on the device: ``capturable=True`` (Adam, AdamW) keeps the step
            counter on the GPU instead of reading it on the host.
        static_shapes: False when the batch or image size changes between steps (each shape
            would need its own graph).
        scaler: fp16's dynamic loss scaling reads the inf check on the host every step.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device, the step runs on {device.type}"
    if not torch.cuda.is_available():
        return "CUDA graphs need a CUDA device, and torch.cuda is not available"
    if not static_shapes:
        return "the input shapes change between steps (dynamic shapes): each shape would need its own graph"
    if model is not None:
        hooked = _hooked_modules(model)
        if hooked:
            return f"Python hooks run every step on {hooked[:3]} (a graph replays kernels, not Python)"
    if optimizer is not None:
        groups = optimizer.param_groups
        if any("capturable" in g and not g["capturable"] for g in groups):
            return f"{type(optimizer).__name__} is not capturable: build it with capturable=True"
    if scaler is not None and scaler.is_enabled():
        return "fp16 loss scaling checks for inf on the host every step: use bf16"
    return None


def compile_mode_for(compile_mode: str, cuda_graphs: bool) -> str:
    """The ``torch.compile`` mode of a compiled step: "reduce-overhead" (inductor's CUDA graphs)
    when graphs are asked for and the mode has none of its own, else ``compile_mode``."""
    check_compile_mode(compile_mode)
    if cuda_graphs and compile_mode in ("default", "max-autotune-no-cudagraphs"):
        return "reduce-overhead" if compile_mode == "default" else "max-autotune"
    return compile_mode


def capture(
    fn: Callable[[], object], *, warmup: int = 3, pool=None
) -> tuple[Callable[[], object], torch.cuda.CUDAGraph]:
    """Capture the zero-argument CUDA step ``fn`` -> (replay, graph).

    ``fn`` runs ``warmup`` times on a side stream first (cuBLAS workspaces, the autograd engine's
    streams, Triton's compilation and lazily created optimizer state must exist before capture),
    then once under capture. ``replay()`` reruns its kernels and returns what the captured call
    returned (static tensors, overwritten by each replay). The warm-up calls are real steps: save
    and restore any state they must not change (:class:`GraphedTrainStep` does).
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()

    def replay():
        graph.replay()
        return out

    return replay, graph


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    ema: Optional[nn.Module] = None,
    amp: Optional[torch.dtype] = None,
    clip_grad: Optional[float] = None,
) -> torch.Tensor:
    """One plain training step: forward (under autocast when ``amp``), backward, gradient-norm
    clipping (when ``clip_grad``; on the device, no host read), optimizer step, EMA update;
    returns the loss (a 0-dim tensor, not read on the host)."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(inputs.device.type, dtype=amp, enabled=amp is not None):
        loss = loss_fn(model(inputs), targets)
    loss.backward()
    if clip_grad:
        nn.utils.clip_grad_norm_(model.parameters(), float(clip_grad))
    optimizer.step()
    if ema is not None:
        ema.update(model)
    return loss.detach()


class GraphedTrainStep:
    """A training step (:func:`train_step`) captured once in a CUDA graph and replayed.

    The example batch fixes the static shapes; each call copies its batch into the static input
    buffers and replays. The warm-up steps before capture run on the example batch and are undone
    (model, optimizer and EMA states restored), so the captured step starts from the caller's
    state. When :func:`why_not_graphed` gives a reason (``self.why_not``), calls run the plain
    step instead. The learning rate must be a tensor for a scheduler to change it between replays
    (a Python float is baked into the graph).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        example_inputs: torch.Tensor,
        example_targets: torch.Tensor,
        *,
        ema: Optional[nn.Module] = None,
        amp: Optional[torch.dtype] = None,
        clip_grad: Optional[float] = None,
        warmup: int = 3,
    ):
        self.model, self.optimizer, self.loss_fn, self.ema, self.amp = model, optimizer, loss_fn, ema, amp
        self.clip_grad = clip_grad
        self.shape = (tuple(example_inputs.shape), tuple(example_targets.shape))
        self.why_not = why_not_graphed(example_inputs.device, model=model, optimizer=optimizer)
        self._replay = None
        if self.why_not is None:
            self._inputs, self._targets = example_inputs.clone(), example_targets.clone()
            saved = self._states()
            self._replay, self.graph = capture(self._plain_step, warmup=warmup)
            self._restore(saved)

    def _plain_step(self, inputs=None, targets=None) -> torch.Tensor:
        inputs = self._inputs if inputs is None else inputs
        targets = self._targets if targets is None else targets
        parts = dict(ema=self.ema, amp=self.amp, clip_grad=self.clip_grad)
        return train_step(self.model, self.optimizer, self.loss_fn, inputs, targets, **parts)

    def _states(self) -> tuple:
        return (
            copy.deepcopy(self.model.state_dict()),
            copy.deepcopy(self.optimizer.state_dict()),
            copy.deepcopy(self.ema.state_dict()) if self.ema is not None else None,
        )

    def _restore(self, saved) -> None:
        # in place: the graph holds the parameters' and the optimizer state's addresses
        model_sd, optim_sd, ema_sd = saved
        self.model.load_state_dict(model_sd)
        if self.ema is not None:
            self.ema.load_state_dict(ema_sd)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        with torch.no_grad():
            for i, p in enumerate(params):  # state_dict numbers the parameters in this order
                before = optim_sd["state"].get(i, {})
                for key, value in self.optimizer.state.get(p, {}).items():
                    if torch.is_tensor(value):  # state created by the warm-up starts from zero, as when created lazily
                        value.copy_(before[key]) if key in before else value.zero_()

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One step on (inputs, targets) -> the loss (a static tensor when graphed: read or clone it
        before the next call)."""
        if self._replay is None:
            return self._plain_step(inputs, targets)
        if (tuple(inputs.shape), tuple(targets.shape)) != self.shape:
            raise ValueError(
                f"the graphed step was captured for inputs {self.shape[0]} and targets {self.shape[1]}, got "
                f"{tuple(inputs.shape)} and {tuple(targets.shape)}: build another GraphedTrainStep for this shape"
            )
        self._inputs.copy_(inputs, non_blocking=True)
        self._targets.copy_(targets, non_blocking=True)
        return self._replay()


class GraphedEvalStep:
    """An evaluation forward (no grad, autocast when ``amp``) captured in a CUDA graph and
    replayed for batches of the example's shape; the plain forward when it cannot be
    (``self.why_not``)."""

    def __init__(
        self, model: nn.Module, example_inputs: torch.Tensor, *, amp: Optional[torch.dtype] = None, warmup: int = 2
    ):
        self.model, self.amp = model, amp
        self.shape = tuple(example_inputs.shape)
        self.why_not = why_not_graphed(example_inputs.device, model=model)
        self._replay = None
        if self.why_not is None:
            self._inputs = example_inputs.clone()
            self._replay, self.graph = capture(lambda: self._forward(self._inputs), warmup=warmup)

    def _forward(self, inputs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), torch.autocast(inputs.device.type, dtype=self.amp, enabled=self.amp is not None):
            return self.model(inputs)

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        if self._replay is None or tuple(inputs.shape) != self.shape:
            return self._forward(inputs)  # a last, smaller batch runs ungraphed
        self._inputs.copy_(inputs, non_blocking=True)
        return self._replay()


def graph_steps(
    steps: dict[str, Callable[[], object]], device: torch.device | str, *, skip: tuple = ()
) -> tuple[dict[str, Callable[[], object]], Optional[str]]:
    """Benchmark steps (zero-argument, static shapes) captured with :func:`capture` -> (steps, why
    not): the steps named in ``skip`` (compiled with ``mode="reduce-overhead"``: inductor graphs
    them itself), and every step when :func:`why_not_graphed` gives a reason, stay as they are; a
    step whose capture fails runs ungraphed and the reason names it."""
    reason = why_not_graphed(device)
    if reason is not None:
        return dict(steps), reason
    out, failed = {}, []
    for name, fn in steps.items():
        if name in skip:
            out[name] = fn
            continue
        try:
            out[name] = capture(fn)[0]
        except Exception as err:  # noqa: BLE001 - that step is timed ungraphed, with the reason
            out[name] = fn
            failed.append(f"{name}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    return out, ("capture failed for " + "; ".join(failed)) if failed else None
