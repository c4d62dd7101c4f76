"""Analytic FLOP counts of the attention layers (2 FLOPs per multiply-add, as FlopCounterMode).

For ``x: [B, N, C]`` (N = H*W grid tokens, no prefix), h heads, head dim d = C/h:

- projections (qkv and proj, every kind): ``2*B*N*C*3C + 2*B*N*C*C = 8 B N C^2``
- softmax core: ``Q K^T`` and ``A V``: ``4 B N^2 C`` (the exponentials are not counted)
- linear core: ``phi(K)^T V`` and ``phi(Q) S``: ``4 B N C d``; the normaliser ``phi(Q) z``: ``2 B N C``
- InLine core: ``(phi(K) - k_bar)^T V`` and ``phi(Q) M``: ``4 B N C d``; local residual
  (depthwise 3x3): ``18 B N C``; its weight predictor (two grouped 1x1 convs on [B, C]):
  ``2 B (C^2 / h + 9 C^2 / h)``

Elementwise work (means, centring, softmax, additions) is not counted, as in the paper's tables.
The other linear attentions (Hydra, Efficient, angular, EfficientViT, FLatten) have no formula
here: :func:`counted_layer_flops` counts their products with ``FlopCounterMode`` (the tests check
that it gives the analytic counts for the three kinds above).
A training step (forward + backward) counts 3x the forward: the backward of every product is two
products of the same size.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from ..layers import uses_local_residual

__all__ = ["attention_layer_flops", "counted_layer_flops"]


def counted_layer_flops(module: torch.nn.Module, x: torch.Tensor, feat_size: Sequence[int]) -> int:
    """FLOPs of one forward ``module(x, feat_size)`` as ``FlopCounterMode`` counts them (no grad,
    softmax in its math form so its two products are seen); a training step is 3x, as above."""
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), counter:
        module(x, tuple(feat_size))
    return int(counter.get_total_flops())


def attention_layer_flops(
    kind: str,
    batch: int,
    tokens: int,
    dim: int,
    heads: int,
    *,
    local_residual: bool | None = None,
    backward: bool = False,
) -> int:
    """FLOPs of one attention layer call (see module docstring for the terms).

    Args:
        kind: "inline", "linear" or "softmax".
        batch, tokens, dim, heads: B, N, C, h.
        local_residual: InLine's 3x3 residual (None = on for InLine only, as the layers).
        backward: count forward + backward (3x the forward).
    """
    if kind not in ("inline", "linear", "softmax"):
        raise ValueError(f"unknown attention kind {kind!r}: expected inline, linear or softmax")
    if dim % heads:
        raise ValueError(f"dim={dim} must be a multiple of heads={heads}")
    b, n, c, h = batch, tokens, dim, heads
    d = c // h
    f = 8 * b * n * c * c
    if kind == "softmax":
        f += 4 * b * n * n * c
    else:
        f += 4 * b * n * c * d
        if kind == "linear":
            f += 2 * b * n * c
    if uses_local_residual(kind, local_residual):
        f += 18 * b * n * c + 2 * b * (c * c // h + 9 * c * c // h)
    return 3 * f if backward else f
