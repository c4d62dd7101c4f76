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
allocator; ``tests/runtime/test_graphs.py`` checks a step for syncs). What cannot be captured falls
back to the plain step with a one-line reason (:func:`why_not_graphed`, in the spirit of
:func:`inline_attn.ops.why_not_fused`).

Use::

    step = GraphedTrainStep(model, optimizer, loss_fn, example_images, example_targets, ema=ema)
    print(step.why_not)           # None when graphed, else why it runs ungraphed
    loss = step(images, targets)  # copies into the static inputs and replays (or runs the step)

The classification trainer uses these through ``train.cuda_graphs`` (:class:`StepGraphs`, each
step captured lazily at its first batch). What the CPU tests check is the host side: the decision table
of :func:`why_not_graphed`, the static buffers, the copy-in, the warm-up undone, a batch of
another shape run ungraphed and the EMA order, with the capture itself replaced by eager
execution (the ``capture_fn`` argument). The capture and replay on a GPU are checked only by
``make gpu-check``: its on-demand ``train`` step (``--steps train``: a bf16 run with
``train.cuda_graphs`` false against one with it true) and ``tests/runtime/test_graphs.py`` there.
"""

from __future__ import annotations

import copy
import logging
import sys
from typing import Callable, Optional, Union

import torch
import torch.nn as nn

from .amp import amp_dtype, amp_name
from .compile import check_compile_mode
from .optim import prepare_for_capture

log = logging.getLogger(__name__)

Setting = Union[str, bool]  # "auto" | True | False (train.cuda_graphs)

__all__ = [
    "GraphedEvalStep",
    "GraphedTrainStep",
    "StepGraphs",
    "capture",
    "capture_beside_loader",
    "graphs_line",
    "compile_mode_for",
    "eager_capture",
    "graph_steps",
    "train_step",
    "why_not_graphed",
]


def _hooked_modules(model: nn.Module) -> list[str]:
    """Names of the modules with a Python hook that runs every step: forward and backward hooks,
    attention hooks, and hooks on their own parameters (gradient and post-accumulate hooks)."""
    names = []
    for name, m in model.named_modules():
        params = m.parameters(recurse=False)
        if (
            m._forward_hooks
            or m._forward_pre_hooks
            or m._backward_hooks
            or m._backward_pre_hooks
            or getattr(m, "_attention_hook", None) is not None
            or any(p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None) for p in params)
        ):
            names.append(name or type(m).__name__)
    return names


def _global_hooks() -> list[str]:
    """The kinds of global module hooks registered (``torch.nn.modules.module.register_module_*_hook``)."""
    from torch.nn.modules import module as m

    kinds = {
        "forward": m._global_forward_hooks,
        "forward pre": m._global_forward_pre_hooks,
        "backward": m._global_backward_hooks,
        "backward pre": m._global_backward_pre_hooks,
    }
    return [kind for kind, hooks in kinds.items() if hooks]


def _optimizer_reason(optimizer: torch.optim.Optimizer) -> Optional[str]:
    """Why ``optimizer``'s step cannot be captured (it reads its state on the host), or None."""
    groups = optimizer.param_groups
    name = type(optimizer).__name__
    if any(g.get("differentiable") for g in groups):
        return f"a differentiable {name} cannot be captured"
    if any("capturable" in g for g in groups):
        if any(not g.get("capturable") and not g.get("fused") for g in groups):
            return f"{name} is not capturable: build it with capturable=True"
        return None
    if not isinstance(optimizer, torch.optim.SGD):
        # no capturable mode (LBFGS, Adagrad, SparseAdam, ...): the step reads its state or a closure on the host
        return f"{name} has no capturable mode: its step runs on the host (use AdamW or SGD)"
    tensor_lr = any(torch.is_tensor(g.get("lr")) for g in groups)
    if tensor_lr and not all(g.get("fused") for g in groups):
        return "SGD reads a tensor lr on the host unless fused: build it with fused=True"
    return None


def _check_graph_arguments(model, optimizer, scaler, amp, accum_steps: int, world_size: int) -> None:
    """ValueError naming the argument and what was expected, for a value no step can have."""
    for key, value in (("world_size", world_size), ("accum_steps", accum_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}={value!r}: expected an integer >= 1")
    if amp != "auto":
        amp_name(amp)  # a ValueError naming an unknown amp
    for key, value, kind in (("model", model, nn.Module), ("optimizer", optimizer, torch.optim.Optimizer)):
        if value is not None and not isinstance(value, kind):
            raise ValueError(f"{key}={type(value).__name__}: expected a {kind.__module__}.{kind.__name__} or None")
    if scaler is not None and not callable(getattr(scaler, "is_enabled", None)):
        raise ValueError(f"scaler={type(scaler).__name__}: expected a torch.amp.GradScaler (is_enabled()) or None")


def why_not_graphed(
    device: torch.device | str,
    *,
    model: Optional[nn.Module] = None,
    optimizer: Optional[torch.optim.Optimizer] = None,
    static_shapes: bool = True,
    scaler: Optional[torch.amp.GradScaler] = None,
    amp: Optional[str | torch.dtype] = None,
    accum_steps: int = 1,
    world_size: int = 1,
    compile: bool = False,
) -> Optional[str]:
    """Why a step on ``device`` cannot be captured in a CUDA graph (one line), or None when it can:
    the one answer to "can this run be graphed?" (the trainer's ``train.cuda_graphs``, the
    benchmarks' ``--cuda-graphs``, :class:`GraphedTrainStep`).

    Arguments no step can have (``world_size`` or ``accum_steps`` below 1, an unknown ``amp``
    name, a ``model`` that is not a module, ...) are a ValueError. ``amp``: None, "none", "fp32",
    "bf16", "fp16", "auto" (fp16 on CUDA), torch's names ("float16", ...) or a torch dtype.
    The checks, in this order (the first that applies is the reason):

    1. ``device``: CUDA graphs exist on CUDA only, and torch.cuda must be available;
    2. ``world_size`` > 1: DDP's gradient all-reduce (bucketed by hooks, NCCL) is not captured here;
    3. ``static_shapes`` False: the batch or image size changes between steps (each shape would
       need its own graph);
    4. ``accum_steps`` > 1: a step of several micro-batches (and DDP's no_sync between them);
    5. fp16 (``amp`` fp16 / float16 / auto, or an enabled ``scaler``): dynamic loss scaling
       reads the inf check on the host every step; bf16 and fp32 need no scaler;
    6. per-step Python hooks: global module hooks, or on ``model`` forward and backward hooks, an
       attention recorder, gradient hooks of its parameters: a graph replays kernels, not Python,
       so the hook would silently stop running;
    7. ``optimizer``: must update on the device: ``capturable=True`` (Adam, AdamW, ...) keeps the
       step counter on the GPU; SGD with a tensor lr must be fused (its other paths read the lr on
       the host); an optimizer without a capturable mode (LBFGS, Adagrad) or a differentiable
       one cannot be captured. :func:`~inline_attn.runtime.optim.build_optimizer` builds AdamW
       fused on CUDA (capture-safe); :func:`~inline_attn.runtime.optim.prepare_for_capture` sets
       AdamW and SGD up for a schedule between replays.

    With ``compile`` (``torch.compile`` in inductor's ``reduce-overhead`` mode, which captures the
    model's graphs itself and decides the rest) only checks 1 and 2 apply.
    """
    _check_graph_arguments(model, optimizer, scaler, amp, accum_steps, world_size)
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device={device!r}: expected a torch device such as 'cuda' or 'cuda:0' ({e})") from None
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device, the step runs on {device.type}"
    if not torch.cuda.is_available():
        return "CUDA graphs need a CUDA device, and torch.cuda is not available"
    if world_size > 1:
        return f"{world_size} processes: DDP's gradient all-reduce is not captured (CUDA graphs run on one process)"
    if compile:
        return None
    if not static_shapes:
        return "the input shapes change between steps (dynamic shapes): each shape would need its own graph"
    if accum_steps > 1:
        return f"{accum_steps} accumulation steps: a captured step is one micro-batch (raise data.batch_size instead)"
    if amp == "auto" or amp_name(amp) == "fp16" or (scaler is not None and scaler.is_enabled()):
        return "fp16 loss scaling checks for inf on the host every step: use bf16"
    if _global_hooks():
        return f"global module hooks ({', '.join(_global_hooks())}) run in Python every step (a graph replays kernels)"
    hooked = _hooked_modules(model) if model is not None else []
    if hooked:
        return f"Python hooks run every step on {hooked[:3]} (a graph replays kernels, not Python)"
    if optimizer is not None:
        return _optimizer_reason(optimizer)
    return None


def compile_mode_for(compile_mode: str, cuda_graphs: bool) -> str:
    """The ``torch.compile`` mode of a compiled step: "reduce-overhead" (inductor's CUDA graphs)
    when graphs are asked for and the mode has none of its own, else ``compile_mode``."""
    check_compile_mode(compile_mode)
    if cuda_graphs and compile_mode in ("default", "max-autotune-no-cudagraphs"):
        return "reduce-overhead" if compile_mode == "default" else "max-autotune"
    return compile_mode


def capture(
    fn: Callable[[], object], *, warmup: int = 3, pool=None, capture_error_mode: str = "global"
) -> tuple[Callable[[], object], torch.cuda.CUDAGraph]:
    """Capture the zero-argument CUDA step ``fn`` -> (replay, graph).

    ``fn`` runs ``warmup`` times on a side stream first (cuBLAS workspaces, the autograd engine's
    streams, Triton's compilation and lazily created optimizer state must exist before capture),
    then once under capture. ``replay()`` reruns its kernels and returns what the captured call
    returned (static tensors, overwritten by each replay). The warm-up calls are real steps: save
    and restore any state they must not change (:class:`GraphedTrainStep` does).
    ``capture_error_mode``: ``torch.cuda.graph``'s; "thread_local" lets other threads (a data
    loader's pin-memory thread allocating page-locked buffers) go on during the capture.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, capture_error_mode=capture_error_mode):
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
) -> Union[torch.Tensor, dict]:
    """One plain training step: forward (under autocast when ``amp``), backward, gradient-norm
    clipping (when ``clip_grad``; on the device, no host read), optimizer step, EMA update;
    returns the loss (a 0-dim tensor, not read on the host). ``loss_fn`` may return a dict of
    loss terms instead, the first the one minimised: the step then returns them all."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(inputs.device.type, dtype=amp, enabled=amp is not None):
        out = loss_fn(model(inputs), targets)
    loss = out if torch.is_tensor(out) else next(iter(out.values()))
    loss.backward()
    if clip_grad:
        nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], float(clip_grad))
    optimizer.step()
    if ema is not None:
        ema.update(model)
    return loss.detach() if torch.is_tensor(out) else {k: v.detach() for k, v in out.items()}


_CHECK = object()  # GraphedTrainStep / GraphedEvalStep: ask why_not_graphed


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def _check_warmup(warmup) -> int:
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r}: expected an integer >= 0 (steps run before the capture)")
    return warmup


def _check_like(name: str, batch: torch.Tensor, static: torch.Tensor) -> None:
    """A batch copied into a static buffer must have its dtype and device: ``copy_`` would convert
    it silently (float64 images to float32, soft float targets to class indices)."""
    if batch.dtype != static.dtype or batch.device != static.device:
        raise ValueError(
            f"{name} of dtype {batch.dtype} on {batch.device}, but the step was captured for {static.dtype} on "
            f"{static.device} (the example batch's): convert the batch, or capture with an example like it"
        )


class GraphedTrainStep:
    """A training step (:func:`train_step`) captured once in a CUDA graph and replayed.

    The example batch fixes the static shapes; each call copies its batch into the static input
    buffers and replays. A batch of another shape (a smaller last batch, a batch with unreadable
    images left out) runs the plain step instead, on the same model and optimizer state
    (``ungraphed_steps`` counts them). The warm-up steps before capture run on the example batch
    and are undone (model, optimizer and EMA states restored in place), so the captured step
    starts from the caller's state. A batch of another dtype or device than the example's is a
    ValueError (copied into the static buffers it would be converted silently); ``warmup`` is an
    integer >= 0. When :func:`why_not_graphed` gives a reason (``self.why_not``),
    or the capture fails (the reason names the error), calls run the plain step. The learning
    rate must be a tensor for a scheduler to change it between replays (a Python float is baked
    into the graph; :func:`inline_attn.runtime.optim.prepare_for_capture`).

    ``why_not``: the reason decided by the caller (None: capture); by default
    :func:`why_not_graphed` of the example's device, the model and the optimizer.
    ``capture_fn``: how the step is captured, :func:`capture` (the CPU tests pass an eager stand-in
    with the same contract, so the host logic runs without a GPU).
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
        why_not=_CHECK,
        capture_fn: Callable = capture,
    ):
        self.model, self.optimizer, self.loss_fn, self.ema, self.amp = model, optimizer, loss_fn, ema, amp
        self.clip_grad = clip_grad
        warmup = _check_warmup(warmup)
        self.shape = (tuple(example_inputs.shape), tuple(example_targets.shape))
        if why_not is _CHECK:
            why_not = why_not_graphed(example_inputs.device, model=model, optimizer=optimizer)
        self.why_not = why_not
        self.replays = self.ungraphed_steps = 0
        self._replay = None
        if self.why_not is None:
            # static input buffers: what the graph reads; each call copies its batch into them
            self._inputs, self._targets = example_inputs.clone(), example_targets.clone()
            saved = self._states()
            try:
                self._replay, self.graph = capture_fn(self._plain_step, warmup=warmup)
            except Exception as err:  # noqa: BLE001 - this run goes on ungraphed, saying why
                self.why_not = f"capture failed: {_first_line(err)}"
            finally:
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
        """One step on (inputs, targets) -> the loss, or ``loss_fn``'s dict of terms (static tensors
        when graphed: read or clone them before the next call)."""
        if self._replay is None:
            return self._plain_step(inputs, targets)
        _check_like("inputs", inputs, self._inputs)
        _check_like("targets", targets, self._targets)
        if (tuple(inputs.shape), tuple(targets.shape)) != self.shape:
            self.ungraphed_steps += 1  # captured for one shape; this batch runs the plain step
            return self._plain_step(inputs, targets)
        self._inputs.copy_(inputs, non_blocking=True)
        self._targets.copy_(targets, non_blocking=True)
        self.replays += 1
        return self._replay()


class GraphedEvalStep:
    """An evaluation forward (no grad, autocast when ``amp``) captured in a CUDA graph and
    replayed for batches of the example's shape; the plain forward for other shapes (a last,
    smaller batch) and when it cannot be captured (``self.why_not``). ``why_not`` and
    ``capture_fn`` as in :class:`GraphedTrainStep`."""

    def __init__(
        self,
        model: nn.Module,
        example_inputs: torch.Tensor,
        *,
        amp: Optional[torch.dtype] = None,
        warmup: int = 2,
        why_not=_CHECK,
        capture_fn: Callable = capture,
    ):
        self.model, self.amp = model, amp
        warmup = _check_warmup(warmup)
        self.shape = tuple(example_inputs.shape)
        self.why_not = why_not_graphed(example_inputs.device, model=model) if why_not is _CHECK else why_not
        self.replays = self.ungraphed_steps = 0
        self._replay = None
        if self.why_not is None:
            self._inputs = example_inputs.clone()
            try:
                self._replay, self.graph = capture_fn(lambda: self._forward(self._inputs), warmup=warmup)
            except Exception as err:  # noqa: BLE001 - evaluated ungraphed, saying why
                self.why_not = f"capture failed: {_first_line(err)}"

    def _forward(self, inputs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), torch.autocast(inputs.device.type, dtype=self.amp, enabled=self.amp is not None):
            return self.model(inputs)

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        if self._replay is None:
            return self._forward(inputs)
        _check_like("inputs", inputs, self._inputs)
        if tuple(inputs.shape) != self.shape:
            self.ungraphed_steps += 1
            return self._forward(inputs)  # a last, smaller batch runs ungraphed
        self._inputs.copy_(inputs, non_blocking=True)
        self.replays += 1
        return self._replay()


def eager_capture(fn: Callable[[], object], *, warmup: int = 3, pool=None) -> tuple[Callable[[], object], None]:
    """A stand-in for :func:`capture` with its contract, for checking the host logic without a
    GPU: ``fn`` runs ``warmup`` times and once more (the capture call; on a GPU its kernels are
    recorded, not run, so callers undo all of these calls' effects the same way), and
    ``replay()`` runs ``fn`` again and copies its result into the tensor the capture call
    returned (a static output, overwritten by each replay, as a graph's is). Nothing is captured:
    it validates the orchestration, not the capture."""
    for _ in range(warmup):
        fn()
    out = fn()

    def replay():
        result = fn()
        if torch.is_tensor(out):
            with torch.no_grad():
                out.copy_(result)
            return out
        return result

    return replay, None


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


def graphs_line(
    setting: Setting, graphed: bool, reason: Optional[str], device: torch.device, compile: bool
) -> Optional[str]:
    """The run's one line about ``train.cuda_graphs`` = ``setting``, or None where it says nothing
    (off, or ``auto`` off the GPU, so a CPU run prints what it printed before graphs existed)."""
    shown = str(setting).lower() if isinstance(setting, bool) else str(setting)
    if graphed:
        how = "torch.compile mode reduce-overhead" if compile else "steps captured in CUDA graphs"
        return f"train.cuda_graphs={shown}: on ({how})"
    if reason is None or (setting == "auto" and device.type != "cuda"):
        return None
    return f"train.cuda_graphs={shown}: running ungraphed: {reason}"


def capture_beside_loader(fn: Callable[[], object], *, warmup: int = 3, pool=None):
    """:func:`capture` in the ``thread_local`` error mode: the loader's pin-memory thread may
    allocate page-locked memory while the step is captured (in the default ``global`` mode that
    call would fail and void the capture)."""
    return capture(fn, warmup=warmup, pool=pool, capture_error_mode="thread_local")


class StepGraphs:
    """The CUDA graphs of one run's steps, each captured lazily at its first batch.

    :meth:`train_step` runs one training step through a :class:`GraphedTrainStep` (static input
    buffers, the batch copied in, replayed; a batch of another shape runs the plain step on the
    same state); :meth:`eval_forward` gives a model's evaluation forward through a
    :class:`GraphedEvalStep`. ``amp``: a name of :data:`~inline_attn.runtime.amp.AMP_NAMES`.
    ``capture_fn`` is :func:`capture_beside_loader`; the CPU tests pass :func:`eager_capture`.
    """

    def __init__(
        self, amp: str, clip_grad: Optional[float], *, capture_fn: Callable = capture_beside_loader, warmup: int = 3
    ):
        self.amp, self.clip_grad, self.capture_fn, self.warmup = amp_dtype(amp), clip_grad, capture_fn, warmup
        self.train: Optional[GraphedTrainStep] = None
        self.evals: dict[int, GraphedEvalStep] = {}

    def train_step(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        ema: Optional[nn.Module],
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        inputs: torch.Tensor,
        targets: torch.Tensor,
    ) -> Union[torch.Tensor, dict]:
        """One optimizer step of ``model`` on (inputs, targets), the ``ema`` update included -> the
        loss or ``loss_fn``'s dict of terms (static tensors when replayed: read them before the next
        step). The schedule is the caller's (``optimizer`` is made ready for capture at the first step)."""
        if self.train is None:
            prepare_for_capture(optimizer)
            self.train = GraphedTrainStep(
                model,
                optimizer,
                loss_fn,
                inputs,
                targets,
                ema=ema,
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
