"""The residual predictor of InLine attention (paper Sec. 4.2) on aten ops.

``w = W2 GELU(W1 ctx + b1) + b2`` with ctx the mean token of the layer input and W1, W2 grouped
1x1 convolutions (one group per head): each sample gets a 3x3 kernel per channel, channel c taking
outputs ``[9c, 9c + 9)`` as a row-major 3x3 kernel.

:func:`predict_residual` is the prediction under autograd (the eager layers' path, and the fused
core's while compiling or exporting). The fused layer core
(:func:`inline_attn.ops.fused.op.inline_layer_core`) computes the same math and its gradient
itself: in C++ on the CPU (``csrc/inline_cpu.cpp``), in one kernel each way on Triton
(:mod:`inline_attn.ops.fused.triton_kernels`).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor


def _hidden(ctx: Tensor, w1: Tensor, b1: Tensor, groups: int) -> Tensor:
    """ctx [B, C] -> the first product's pre-activation y1 [groups, B, C/groups].

    Row layout [groups, B, C/g]: the context's gradient comes back contiguous (a transposed one
    made the layer input's gradient, which adds it to every token, an uncoalesced [B, N, C] sum:
    0.2 ms per layer step on an H100 at 14 x 14, B 1024)."""
    b, c = ctx.shape
    cg = c // groups
    return torch.baddbmm(b1.view(groups, 1, cg), ctx.view(b, groups, cg).transpose(0, 1), w1.view(groups, cg, cg).mT)


def _predict(ctx: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, groups: int) -> Tensor:
    b, c = ctx.shape
    og = w2.shape[0] // groups
    a = F.gelu(_hidden(ctx, w1, b1, groups))
    # The second product in column layout [groups, 9C/g, B]: W @ y takes the largest weight in its
    # own [out, in] layout, so neither the product nor its gradient needs a transposed copy.
    y = torch.baddbmm(b2.view(groups, og, 1), w2.view(groups, og, c // groups), a.mT)
    # channel c takes outputs [9c, 9c + 9): a strided view, copied once by whoever needs a layout
    return y.view(groups * og, b).t().view(b, c, 3, 3)


def _autocast_off(device: torch.device):
    """A block where autocast is off on ``device`` (the predictor computes in its own dtype)."""
    if device.type in ("cpu", "cuda") and torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def predict_residual(context: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, groups: int) -> Tensor:
    """context [B, C] -> residual weights [B, C, 3, 3].

    w1: [C, C/g(, 1)], b1: [C], w2: [9C, C/g(, 1)], b2: [9C] (the grouped 1x1 convolutions'
    parameters, evaluated as batched matmuls over the groups: oneDNN's convolution on length-1
    signals costs several times its arithmetic when there are many samples). Under autocast the
    prediction runs in the parameters' dtype (float32 in mixed precision): its arithmetic is
    negligible, and autocast's casts of inputs, weights and biases (and of their gradients) would
    be a dozen extra kernel launches per layer, which is what a small layer's GPU step waits on.
    """
    if context.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(context.device.type):
        with _autocast_off(context.device):
            return _predict(context.to(w1.dtype), w1, b1, w2, b2, groups)
    return _predict(context, w1, b1, w2, b2, groups)
