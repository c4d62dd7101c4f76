"""The residual predictor of InLine attention (paper Sec. 4.2) on aten ops.

``w = W2 GELU(W1 ctx + b1) + b2`` with ctx the mean token of the layer input and W1, W2 grouped
1x1 convolutions (one group per head): each sample gets a 3x3 kernel per channel, channel c taking
outputs ``[9c, 9c + 9)`` as a row-major 3x3 kernel.

- :func:`predict_residual`: the prediction under autograd (the eager layers' path);
- :func:`predictor_forward` / :func:`predictor_backward`: the same math and its gradient written
  out, without autograd: the C++ backend's half of the fused layer core
  (:func:`inline_attn.ops.fused.op.inline_layer_core`), whose Triton backend runs both in one
  kernel each (:mod:`inline_attn.ops.fused.triton_kernels`).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import cast


def predictor_dtype(w1: Tensor) -> torch.dtype:
    """The predictor computes in its weights' dtype, at least float32 (float64 or float32)."""
    return torch.float64 if w1.dtype == torch.float64 else torch.float32


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
    if torch.is_autocast_enabled(context.device.type):
        with _autocast_off(context.device):
            return _predict(context.to(w1.dtype), w1, b1, w2, b2, groups)
    return _predict(context, w1, b1, w2, b2, groups)


def predictor_forward(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, groups: int) -> tuple[Tensor, Tensor]:
    """x [B, N, C] -> (ctx [B, C], taps [B, 9, C]) in :func:`predictor_dtype`, no autograd.

    ctx = mean_n x (kept for the backward); taps[b, t, c] = w[b, c, t // 3, t % 3], the fused
    kernels' layout."""
    dtype = predictor_dtype(w1)
    with _autocast_off(x.device):  # an autograd.Function's forward runs under the caller's autocast
        ctx = x.mean(dim=1, dtype=dtype)
        w = _predict(ctx, cast(w1, dtype), cast(b1, dtype), cast(w2, dtype), cast(b2, dtype), groups)
    b, c = ctx.shape
    return ctx, w.reshape(b, c, 9).transpose(1, 2).contiguous()


def predictor_backward(
    ctx: Tensor, dtaps: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, groups: int, n: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of :func:`predictor_forward` for the taps' gradient dtaps [B, 9, C]:
    (dctx / N [B, C], dw1 [C, C/g], db1 [C], dw2 [9C, C/g], db2 [9C]) in ctx's dtype.

    With y1 = W1 ctx + b1 (recomputed) and a = GELU(y1): dW2 = dy2 a^T, da = W2^T dy2,
    dy1 = da GELU'(y1), dW1 = dy1 ctx^T, dctx = W1^T dy1, per group, summed over the samples."""
    with _autocast_off(ctx.device):
        return _predictor_backward(ctx, cast(dtaps, ctx.dtype), w1, b1, w2, groups, n)


def _predictor_backward(ctx, dtaps, w1, b1, w2, groups, n):
    b, c = ctx.shape
    cg = c // groups
    dtype = ctx.dtype
    w1, w2 = cast(w1, dtype), cast(w2, dtype)
    w1g, w2g = w1.view(groups, cg, cg), w2.view(groups, 9 * cg, cg)
    y1 = _hidden(ctx, w1, cast(b1, dtype), groups)  # [g, B, cg]
    dy2 = dtaps.permute(2, 1, 0).reshape(groups, 9 * cg, b)  # output 9c + t, column layout as the forward
    dw2 = torch.bmm(dy2, F.gelu(y1))
    dy1 = torch.ops.aten.gelu_backward(torch.bmm(dy2.mT, w2g), y1)  # [g, B, cg]
    dw1 = torch.bmm(dy1.mT, ctx.view(b, groups, cg).transpose(0, 1))
    dctx = torch.bmm(dy1, w1g).transpose(0, 1).reshape(b, c) / n
    return dctx, dw1.reshape(c, cg), dy1.sum(1).reshape(c), dw2.reshape(9 * c, cg), dy2.sum(2).reshape(9 * c)
