"""Functional attention ops on ``[B, H, N, D]`` tensors.

One dispatch point, :func:`attention`, chooses between the naive reference (explicit weights,
:mod:`.naive`) and the fast paths (:mod:`.fast`).
"""
from __future__ import annotations

import torch

from .fast import inline_attention, linear_attention, local_residual, softmax_attention
from .kernels import KERNELS, get_kernel
from .naive import ATTENTION_KINDS, attention_weights, naive_attention, naive_local_residual
from .tokens import TOKEN_IMPLS, grid_residual, inline_tokens
from .cpu_kernel import cpu_kernel_available, use_cpu_kernel

IMPLS = ("fast", "naive")


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    kind: str = "inline",
    kernel=None,
    scale: float | None = None,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    impl: str = "fast",
) -> torch.Tensor:
    """Attention of one kind, by one implementation: the single dispatch point.

    Args:
        q: [B, H, Nq, D]; k: [B, H, N, D]; v: [B, H, N, Dv].
        kind: "inline", "linear" or "softmax".
        kernel: phi for inline (default identity) / linear (default relu).
        scale: inline / softmax scale, default ``D**-0.5``.
        bias, mask: softmax only.
        impl: "fast" (linear-time / SDPA) or "naive" (explicit weights).
    Returns:
        [B, H, Nq, Dv].
    """
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}: expected one of {IMPLS}")
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"unknown attention kind {kind!r}: expected one of {ATTENTION_KINDS}")
    if kind != "softmax" and (bias is not None or mask is not None):
        raise ValueError(f"bias and mask apply to softmax attention only, got kind={kind!r}")
    if impl == "naive":
        return naive_attention(q, k, v, kind=kind, kernel=kernel, scale=scale, bias=bias, mask=mask)
    if kind == "inline":
        return inline_attention(q, k, v, kernel="identity" if kernel is None else kernel, scale=scale)
    if kind == "linear":
        return linear_attention(q, k, v, kernel="relu" if kernel is None else kernel)
    return softmax_attention(q, k, v, scale=scale, bias=bias, mask=mask)


__all__ = [
    "TOKEN_IMPLS",
    "cpu_kernel_available",
    "grid_residual",
    "inline_tokens",
    "use_cpu_kernel",
    "ATTENTION_KINDS",
    "IMPLS",
    "KERNELS",
    "attention",
    "attention_weights",
    "get_kernel",
    "inline_attention",
    "linear_attention",
    "local_residual",
    "naive_attention",
    "naive_local_residual",
    "softmax_attention",
]
