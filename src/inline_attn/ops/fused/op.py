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

:func:`inline_core` is what callers use: the custom op while ``torch.compile`` traces, and outside
it the same two functions through one ``torch.autograd.Function``, which skips the custom op's
Python dispatch (~60-100 us a call on these CPUs, as much as a small layer's whole core).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.utils.flop_counter import register_flop_formula

from . import cpu as cpu_kernel

BACKENDS = ("cpu", "triton")


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {BACKENDS}")


def _forward_impl(q, k, v, w9, num_heads, scale, H, W, num_prefix_tokens, backend):
    _check_backend(backend)
    if backend == "cpu":
        return cpu_kernel.cpu_forward(q, k, v, w9, num_heads, scale, H, W, num_prefix_tokens)
    from .triton import inline_forward_triton

    return inline_forward_triton(q, k, v, w9, num_heads, scale, H, W, num_prefix_tokens)


def _backward_impl(q, k, v, w9, grad, num_heads, scale, H, W, num_prefix_tokens, backend):
    _check_backend(backend)
    if backend == "cpu":
        return cpu_kernel.cpu_backward(q, k, v, w9, grad, num_heads, scale, H, W, num_prefix_tokens)
    from .triton import inline_backward_triton

    return inline_backward_triton(q, k, v, w9, grad, num_heads, scale, H, W, num_prefix_tokens)


@torch.library.custom_op("inline_attn::inline_forward", mutates_args=())
def inline_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w9: Optional[Tensor],
    num_heads: int,
    scale: float,
    H: int,
    W: int,
    num_prefix_tokens: int,
    backend: str,
) -> Tensor:
    """q, k, v: [B, N, C] (any strides); w9: [B, 9, C] residual taps (q's dtype or float32) or
    None -> O [B, N, C] in q's dtype."""
    return _forward_impl(q, k, v, w9, num_heads, scale, H, W, num_prefix_tokens, backend)


@torch.library.custom_op("inline_attn::inline_backward", mutates_args=())
def inline_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w9: Optional[Tensor],
    grad: Tensor,
    num_heads: int,
    scale: float,
    H: int,
    W: int,
    num_prefix_tokens: int,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients (dq, dk, dv, dw9) of :func:`inline_forward`, dw9 in w9's dtype (empty without a
    residual)."""
    return _backward_impl(q, k, v, w9, grad, num_heads, scale, H, W, num_prefix_tokens, backend)


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


@register_flop_formula(torch.ops.inline_attn.inline_forward)
def _flops(q_shape, k_shape, v_shape, w9_shape, num_heads, *args, out_shape=None, **kwargs):
    """Counted like the eager path: the two d x d products of every head (2 N d^2 MACs per head)
    and the residual as a 3x3 depthwise convolution (9 MACs per grid token and channel); means
    and sums are not counted (as in eager)."""
    b, n, c = q_shape
    h, w = args[1], args[2]
    macs = 2 * b * n * c * (c // num_heads)
    if w9_shape is not None:
        macs += 9 * b * h * w * c
    return 2 * macs


@register_flop_formula(torch.ops.inline_attn.inline_backward)
def _flops_backward(q_shape, k_shape, v_shape, w9_shape, g_shape, num_heads, *args, out_shape=None, **kwargs):
    """The kernels' own work: five d x d products per head (M recomputed, dM, dQ, dK, dV) and the
    residual's two transposed 3x3 passes (dV and dw)."""
    b, n, c = q_shape
    h, w = args[1], args[2]
    macs = 5 * b * n * c * (c // num_heads)
    if w9_shape is not None:
        macs += 18 * b * h * w * c
    return 2 * macs


class _InLineCore(torch.autograd.Function):
    """The custom op's forward and backward without its dispatch overhead (eager mode only)."""

    @staticmethod
    def forward(ctx, q, k, v, w9, *args):
        ctx.save_for_backward(q, k, v, w9)
        ctx.args = args
        return _forward_impl(q, k, v, w9, *args)

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():  # create_graph=True: the kernels' backward has no derivative
            raise RuntimeError(
                "inline_attn::inline_backward has no derivative: second-order gradients of the fused InLine "
                "kernels are not implemented (use impl='eager' for double backward)"
            )
        q, k, v, w9 = ctx.saved_tensors
        dq, dk, dv, dw = _backward_impl(q, k, v, w9, grad, *ctx.args)
        return dq, dk, dv, (dw if w9 is not None else None), None, None, None, None, None, None


def inline_core(
    q, k, v, w9, num_heads: int, scale: float, H: int, W: int, num_prefix_tokens: int, backend: str
) -> Tensor:
    """The fused layer core (arguments as :func:`inline_forward`): the custom op under
    ``torch.compile`` or a dispatch mode (``FlopCounterMode``, memory trackers: they see one op
    with its FLOP formula), the same kernels through :class:`_InLineCore` otherwise."""
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return inline_forward(q, k, v, w9, num_heads, scale, H, W, num_prefix_tokens, backend)
    return _InLineCore.apply(q, k, v, w9, num_heads, scale, H, W, num_prefix_tokens, backend)
