"""The fused InLine layer core as custom ops: ``inline_attn::inline_forward`` and its backward.

``O = concat_heads(Q_h M_h + v_bar_h) + R(V, w)`` on token-major [B, N, C] tensors (paper Eq. 5
and Sec. 4.2, identity feature map; :func:`inline_attn.ops.inline_tokens` documents the
arguments). One op serves two backends, named by its ``backend`` argument:

- ``"cpu"``: the C++ kernel (:mod:`.cpu_kernel`; CPU tensors; bf16 / fp16 computed in float32);
- ``"triton"``: the Triton kernels (:mod:`.triton_core`; CUDA tensors, or CPU tensors under
  Triton's interpreter; fp32 accumulation whatever the input dtype).

Registered with ``torch.library.custom_op``: a fake (meta) rule, so ``torch.compile`` keeps the op
in the graph as one opaque node (``fullgraph=True`` works); autograd through
``register_autograd`` (first order: the backward op has no derivative, so a double backward
raises instead of silently dropping terms); FLOP formulas for ``FlopCounterMode``.

:func:`inline_layer_core` adds the residual predictor (the layer input's token mean, two grouped
products, GELU: :mod:`inline_attn.ops.predictor`) inside one autograd node in eager mode: the C++
op ``cpu_layer`` on the CPU (forward, backward and autograd in C++), one ``autograd.Function``
with one predictor kernel each way on Triton.

:func:`inline_core` is what callers use: the custom op while ``torch.compile`` / ``torch.export``
traces or a dispatch mode records, and outside them the same kernels under one autograd node (the
C++ op ``cpu_core``'s own on the CPU, one ``torch.autograd.Function`` on Triton), which skips the
custom op's Python dispatch (~60-100 us a call on these CPUs, as much as a small layer's whole core).

Under ``torch.compile`` on CUDA tensors the Triton backend is instead the ``torch.library.triton_op``
pair ``inline_attn::kernels_forward`` / ``kernels_backward``: AOT autograd traces into their
launchers, each launch becomes a ``triton_kernel_wrapper_functional`` node (of the kernel's flat
twin, :mod:`.triton_flat`), and the compiled graph launches the kernels with no custom op or
launcher Python. ``torch.export`` keeps the opaque ``inline_forward`` (one node with its ONNX
translation).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Optional

import torch
from torch import Tensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from .._checks import cast
from ..compile_marks import constant_when_compiled, exporting
from . import cpu as cpu_kernel
from .triton import (  # imports no triton (its launches do)
    inline_backward_triton,
    inline_forward_triton,
    layer_backward_triton,
    layer_forward_triton,
)

BACKENDS = ("cpu", "triton")


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {BACKENDS}")


# backend -> the core's (forward, backward) kernels
_KERNELS = {
    "cpu": (cpu_kernel.cpu_forward, cpu_kernel.cpu_backward),
    "triton": (inline_forward_triton, inline_backward_triton),
}


def _kernels(backend: str):
    """The (forward, backward) kernels of ``backend``."""
    if backend not in _KERNELS:
        _check_backend(backend)
    return _KERNELS[backend]


def _forward_impl(q, k, v, w9, num_heads, scale, H, W, num_prefix_tokens, backend):
    forward, _ = _kernels(backend)
    return forward(q, k, v, w9, num_heads, scale, H, W, num_prefix_tokens)


def _backward_impl(q, k, v, w9, grad, num_heads, scale, H, W, num_prefix_tokens, backend):
    _, backward = _kernels(backend)
    return backward(q, k, v, w9, grad, num_heads, scale, H, W, num_prefix_tokens)


# The scalar arguments of both ops, as their schemas spell them (``int`` is inferred as SymInt).
_CORE_ARGS = "SymInt num_heads, float scale, SymInt H, SymInt W, SymInt num_prefix_tokens, str backend"


@torch.library.custom_op(
    "inline_attn::inline_forward",
    mutates_args=(),
    schema=f"(Tensor q, Tensor k, Tensor v, Tensor? w9, {_CORE_ARGS}) -> Tensor",
)
def inline_forward(q: Tensor, k: Tensor, v: Tensor, w9: Optional[Tensor], *args) -> Tensor:
    """q, k, v: [B, N, C] (any strides); w9: [B, 9, C] residual taps (q's dtype or float32) or
    None; then num_heads, scale, H, W, num_prefix_tokens, backend -> O [B, N, C] in q's dtype."""
    return _forward_impl(q, k, v, w9, *args)


@torch.library.custom_op(
    "inline_attn::inline_backward",
    mutates_args=(),
    schema=f"(Tensor q, Tensor k, Tensor v, Tensor? w9, Tensor grad, {_CORE_ARGS}) -> (Tensor, Tensor, Tensor, Tensor)",
)
def inline_backward(q: Tensor, k: Tensor, v: Tensor, w9: Optional[Tensor], grad: Tensor, *args):
    """Gradients (dq, dk, dv, dw9) of :func:`inline_forward`, dw9 in w9's dtype (empty without a
    residual)."""
    return _backward_impl(q, k, v, w9, grad, *args)


@inline_forward.register_fake
def _forward_fake(q, k, v, w9, num_heads, scale, H, W, num_prefix_tokens, backend):
    return q.new_empty(q.shape)  # contiguous, whatever q's strides


@inline_backward.register_fake
def _backward_fake(q, k, v, w9, grad, num_heads, scale, H, W, num_prefix_tokens, backend):
    dw = w9.new_empty(w9.shape) if w9 is not None else q.new_empty(0)
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape), dw


def _setup_context(ctx, inputs, output):
    q, k, v, w9, *args = inputs
    ctx.save_for_backward(q, k, v, w9)
    ctx.args = args


def _backward(ctx, grad):
    q, k, v, w9 = ctx.saved_tensors
    dq, dk, dv, dw = inline_backward(q, k, v, w9, grad, *ctx.args)
    return dq, dk, dv, (dw if w9 is not None else None), None, None, None, None, None, None


inline_forward.register_autograd(_backward, setup_context=_setup_context)


# The Triton kernels as a ``torch.library.triton_op`` pair, for ``torch.compile`` on CUDA tensors:
# AOT autograd traces into them (their launches become ``triton_kernel_wrapper_functional`` nodes of
# the kernels' flat twins, :mod:`.triton_flat`), and the compiled graph launches the kernels itself,
# with no custom op or launcher Python at run time. ``torch.export`` keeps the opaque
# ``inline_forward`` (one node, its ONNX translation), and so do the CPU backend and Triton's
# interpreter. Registered on first use: ``triton_op`` imports triton and inductor (seconds of start-up).

_kernel_ops: list = []  # [kernels_forward, kernels_backward] once registered


@constant_when_compiled  # under torch.compile: run once while tracing (it registers ops), not traced
def kernel_ops_registered() -> bool:
    """Register ``inline_attn::kernels_forward`` and ``inline_attn::kernels_backward`` (once) -> True."""
    if not _kernel_ops:
        _kernel_ops.extend(_register_kernel_ops())
    return True


def _register_kernel_ops() -> tuple:
    @torch.library.triton_op("inline_attn::kernels_forward", mutates_args=())
    def kernels_forward(
        q: Tensor, k: Tensor, v: Tensor, w9: Optional[Tensor], num_heads: int, scale: float, H: int, W: int, p: int
    ) -> Tensor:
        """:func:`inline_forward` on the Triton kernels (CUDA tensors), traceable by ``torch.compile``."""
        return _forward_impl(q, k, v, w9, num_heads, scale, H, W, p, "triton")

    @torch.library.triton_op("inline_attn::kernels_backward", mutates_args=())
    def kernels_backward(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        w9: Optional[Tensor],
        grad: Tensor,
        num_heads: int,
        scale: float,
        H: int,
        W: int,
        p: int,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """:func:`inline_backward` on the Triton kernels (CUDA tensors), traceable by ``torch.compile``."""
        return _backward_impl(q, k, v, w9, grad, num_heads, scale, H, W, p, "triton")

    def backward(ctx, grad):
        q, k, v, w9 = ctx.saved_tensors
        dq, dk, dv, dw = kernels_backward(q, k, v, w9, grad, *ctx.args)
        return dq, dk, dv, (dw if w9 is not None else None), None, None, None, None, None

    kernels_forward.register_autograd(backward, setup_context=_setup_context)
    from torch.utils.flop_counter import register_flop_formula

    register_flop_formula(torch.ops.inline_attn.kernels_forward)(_flops)
    register_flop_formula(torch.ops.inline_attn.kernels_backward)(_flops_backward)
    return kernels_forward, kernels_backward


def _core_flops(q_shape, w9_shape, num_heads: int, grid, products: int, residual_passes: int) -> int:
    """FLOPs of ``products`` d x d products per head and ``residual_passes`` 3x3 depthwise passes
    (9 MACs per grid token and channel) on the [B, N, C] tokens of q_shape; grid: (H, W)."""
    b, n, c = q_shape
    h, w = grid
    macs = products * b * n * c * (c // num_heads)
    if w9_shape is not None:
        macs += residual_passes * 9 * b * h * w * c
    return 2 * macs


def _flops(q_shape, k_shape, v_shape, w9_shape, num_heads, *args, out_shape=None, **kwargs):
    """Counted like the eager path: the two d x d products of every head (2 N d^2 MACs per head)
    and the residual as a 3x3 depthwise convolution (9 MACs per grid token and channel); means
    and sums are not counted (as in eager)."""
    return _core_flops(q_shape, w9_shape, num_heads, args[1:3], 2, 1)


def _flops_backward(q_shape, k_shape, v_shape, w9_shape, g_shape, num_heads, *args, out_shape=None, **kwargs):
    """The kernels' own work: five d x d products per head (M recomputed, dM, dQ, dK, dV) and the
    residual's two transposed 3x3 passes (dV and dw)."""
    return _core_flops(q_shape, w9_shape, num_heads, args[1:3], 5, 2)


_flops_registered = []


def register_flop_formulas() -> None:
    """Give ``FlopCounterMode`` the custom ops' FLOP formulas (once; later calls return at once).

    ``torch.utils.flop_counter`` imports triton where it is installed (about 1 s), so importing this
    module does not import it: the formulas are registered right after it is first imported
    (:class:`_AfterImport`), or now if it already is. A ``FlopCounterMode`` copies the registry
    when it is made, so the formulas must be in place before then."""
    if _flops_registered:
        return
    from torch.utils.flop_counter import register_flop_formula

    register_flop_formula(torch.ops.inline_attn.inline_forward)(_flops)
    register_flop_formula(torch.ops.inline_attn.inline_backward)(_flops_backward)
    _flops_registered.append(True)


class _AfterImport(importlib.abc.MetaPathFinder):
    """A one-shot import hook: runs ``callback()`` right after module ``name`` is first executed."""

    def __init__(self, name: str, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # the other finders locate the module; this hook runs once
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            self.callback()

        spec.loader.exec_module = exec_module
        return spec


if "torch.utils.flop_counter" in sys.modules:
    register_flop_formulas()
else:
    sys.meta_path.insert(0, _AfterImport("torch.utils.flop_counter", register_flop_formulas))


def _no_double_backward() -> None:
    if torch.is_grad_enabled():  # create_graph=True: the kernels' backward has no derivative
        raise RuntimeError(
            "inline_attn::inline_backward has no derivative: second-order gradients of the fused InLine "
            "kernels are not implemented (use impl='eager' for double backward)"
        )


class _InLineCore(torch.autograd.Function):
    """The custom op's forward and backward without its dispatch overhead (eager mode only; the
    C++ backend has its own autograd node, ``cpu_core``)."""

    @staticmethod
    def forward(ctx, q, k, v, w9, *args):
        ctx.save_for_backward(q, k, v, w9)
        ctx.args = args
        return _forward_impl(q, k, v, w9, *args)

    @staticmethod
    def backward(ctx, grad):
        _no_double_backward()
        q, k, v, w9 = ctx.saved_tensors
        dq, dk, dv, dw = _backward_impl(q, k, v, w9, grad, *ctx.args)
        return dq, dk, dv, (dw if w9 is not None else None), None, None, None, None, None, None


def runs_as_custom_op() -> bool:
    """True while ``torch.compile`` / ``torch.export`` traces or a dispatch mode records: then the
    fused core is called as its custom op (one graph node with a fake rule and a FLOP formula).

    A dispatch mode (``FlopCounterMode``, a memory tracker, ``make_fx``) is told by the flag that
    entering one sets (a module global: no walk of the mode stack on every layer call)."""
    return torch.compiler.is_compiling() or is_in_torch_dispatch_mode()


def compiles_kernels(q: Tensor) -> bool:
    """True while ``torch.compile`` (not ``torch.export``) traces a call on CUDA tensors: then the
    Triton backend is called as :func:`kernels_forward`, whose kernels the compiled graph launches.
    Export is told by :func:`~inline_attn.ops.compile_marks.exporting` (torch 2.11's Dynamo folds
    ``torch.compiler.is_exporting()`` to True under ``torch.compile`` too)."""
    return q.device.type == "cuda" and torch.compiler.is_compiling() and not exporting()


def inline_core(
    q, k, v, w9, num_heads: int, scale: float, H: int, W: int, num_prefix_tokens: int, backend: str
) -> Tensor:
    """The fused layer core (arguments as :func:`inline_forward`): the custom op under
    ``torch.compile`` or a dispatch mode (``FlopCounterMode``, memory trackers: they see one op
    with its FLOP formula), the same kernels otherwise: the C++ op ``cpu_core`` (its autograd node
    in C++) or :class:`_InLineCore` around the Triton launchers."""
    if runs_as_custom_op():
        if backend == "triton" and compiles_kernels(q) and kernel_ops_registered():
            return torch.ops.inline_attn.kernels_forward(q, k, v, w9, num_heads, scale, H, W, num_prefix_tokens)
        return inline_forward(q, k, v, w9, num_heads, scale, H, W, num_prefix_tokens, backend)
    if backend == "cpu":
        return cpu_kernel.cpu_core(q, k, v, w9, num_heads, scale, H, W, num_prefix_tokens)
    return _InLineCore.apply(q, k, v, w9, num_heads, scale, H, W, num_prefix_tokens, backend)


# The layer core with its residual predictor: ``O = InLine(q, k, v) + R(v, P(mean_n x))`` in one
# autograd node, so that an eager layer step crosses one autograd boundary. On the CPU the node is
# the C++ op's own (``cpu_layer``: the predictor and the core each way in C++, no Python); on
# Triton it is :class:`_TritonLayerCore`, with the predictor's kernels beside the core's (forward:
# predictor_fwd + the core's; backward: the core's + predictor_bwd, and predictor_bwd_merge from
# four blocks of samples on).

_FLOAT32_LAYER = (torch.float32,) * 5  # x and the predictor's four parameters, the usual dtypes


def _flat_params(*params):
    """The predictor's parameters as the kernels read them: fp32, contiguous. The kernels index
    the weights by flat offsets, so a Conv1d weight [rows, C/g, 1] is read as [rows, C/g] without
    a reshape."""
    return [p if p.dtype == torch.float32 and p.is_contiguous() else p.float().contiguous() for p in params]


class _TritonLayerCore(torch.autograd.Function):
    """The layer core with its predictor on the Triton kernels (eager mode only): ``args`` is
    (num_heads, scale, H, W, num_prefix_tokens). The predictor's kernels compute and return fp32,
    its gradients shaped as the parameters (the kernels write a Conv1d weight's gradient in its
    own shape); they are cast back to each input's dtype where it is not fp32, and x's is dctx / N
    broadcast over the tokens (an expanded view: autograd adds it to the projection's gradient of x)."""

    @staticmethod
    def forward(ctx, x, q, k, v, w1, b1, w2, b2, args):
        dtypes = (x.dtype, w1.dtype, b1.dtype, w2.dtype, b2.dtype)
        if dtypes != _FLOAT32_LAYER or not (
            w1.is_contiguous() and b1.is_contiguous() and w2.is_contiguous() and b2.is_contiguous()
        ):
            w1, b1, w2, b2 = _flat_params(w1, b1, w2, b2)  # the usual parameters pass as they are
        out, c, taps = layer_forward_triton(x, q, k, v, w1, b1, w2, b2, *args)  # c, taps: fp32, contiguous
        ctx.save_for_backward(q, k, v, c, taps, w1, b1, w2)
        ctx.meta = (x.shape, None if dtypes == _FLOAT32_LAYER else dtypes, args)
        return out

    @staticmethod
    def backward(ctx, grad):
        _no_double_backward()
        x_shape, dtypes, args = ctx.meta
        dq, dk, dv, dctx, dw1, db1, dw2, db2 = layer_backward_triton(*ctx.saved_tensors, grad, *args)
        if dtypes is not None:
            dctx, dw1, db1, dw2, db2 = map(cast, (dctx, dw1, db1, dw2, db2), dtypes)
        return dctx.expand(x_shape), dq, dk, dv, dw1, db1, dw2, db2, None


# ``Function.apply`` is a Python wrapper around the C++ ``apply`` that it then calls: it binds
# default arguments for a ``setup_context`` (this Function defines none) and unwraps dead
# functorch wrappers (the dispatch keeps torch.func transforms off the fused path: ``tracing_reason``).
# The wrapper cost about 4 % of a small layer step's host time (``python -m inline_attn.bench.host``),
# so the layer core calls the C++ ``apply`` directly.
_apply_triton_layer = super(torch.autograd.Function, _TritonLayerCore).apply


def inline_layer_core(
    x, q, k, v, w1, b1, w2, b2, num_heads: int, scale: float, H: int, W: int, num_prefix_tokens: int, backend: str
) -> Tensor:
    """The fused layer core with its residual predictor, eager mode only -> O [B, N, C].

    x: [B, N, C] the layer input (its token mean is the predictor's context); q, k, v as
    :func:`inline_forward`; w1 [C, C/h(, 1)], b1 [C], w2 [9C, C/h(, 1)], b2 [9C] the predictor's
    grouped products (one group per head). One autograd node: the C++ op ``cpu_layer`` (its
    autograd registered in C++) or :class:`_TritonLayerCore`. While :func:`runs_as_custom_op`,
    callers predict the weights on aten ops and call :func:`inline_core` instead (one
    ``inline_forward`` node per layer for export and its ONNX translation, the FLOP formula for
    ``FlopCounterMode``, and inductor fuses the predictor's small ops itself)."""
    if backend == "cpu":
        return cpu_kernel.cpu_layer(x, q, k, v, w1, b1, w2, b2, num_heads, scale, H, W, num_prefix_tokens)
    if backend != "triton":
        _check_backend(backend)
    return _apply_triton_layer(x, q, k, v, w1, b1, w2, b2, (num_heads, scale, H, W, num_prefix_tokens))
