"""Functional attention ops.

- :func:`inline_tokens`: the InLine layer core on token-major [B, N, C] tensors (all heads plus
  the local residual), the op every model family calls; its implementation is chosen in one place,
  :mod:`.dispatch` (``impl``: :data:`IMPLS` = auto, naive, eager, cpu, triton; :func:`why_not_fused`).
- :func:`inline_attention`, :func:`linear_attention`: shaped like SDPA on [B, H, N, D] tensors
  (:mod:`.sdpa`): cross-attention, key-padding masks, causal order; :func:`inline_attention_step`
  and :func:`inline_state` carry causal InLine token by token (:class:`InLineState`).
- :func:`attention`: one attention kind (inline, linear, softmax) on [B, H, N, D] tensors, by the
  naive reference (explicit weights, :mod:`.naive`) or the linear-time / SDPA path: the impls of
  :data:`ATTENTION_IMPLS`.
"""

from __future__ import annotations

import torch

from .fused import _triton_env  # noqa: F401  (must run before anything imports triton)

from .eager import local_residual, softmax_attention
from .causal import InLineState
from .sdpa import inline_attention, inline_attention_step, inline_state, linear_attention
from .feature_maps import FEATURE_MAPS, FeatureMap, get_feature_map
from .naive import ATTENTION_KINDS, attention_weights, naive_attention, naive_local_residual
from .fused.cpu import cpu_kernel_available, cpu_kernel_error
from . import dispatch
from .dispatch import ATTENTION_IMPLS, IMPLS, default_impl, use_impl, why_not_fused
from .tokens import grid_residual, inline_tokens
from ._checks import check_count, check_feat_size, check_scale


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    kind: str = "inline",
    feature_map: FeatureMap = None,
    scale: float | None = None,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    impl: str = "auto",
) -> torch.Tensor:
    """Attention of one kind, by one implementation: the single dispatch point.

    Args:
        q: [B, H, Nq, D]; k: [B, H, N, D]; v: [B, H, N, Dv].
        kind: "inline", "linear" or "softmax".
        feature_map: phi for inline (default identity) / linear (default relu).
        scale: inline / softmax scale, a positive real, default ``D**-0.5`` (linear attention takes
            none: its row normalisation cancels it, so a scale there is refused).
        bias, mask: softmax only (as feature_map is inline / linear only): a float bias and a bool
            keep-mask (True = attend) or float mask, broadcastable to [B, H, Nq, Nk] on q's device.
        key_padding_mask: [B, Nk] bool, True = a padded key; is_causal: query i sees keys ``j <= i``
            (every kind; a query that sees no key gets zeros).
        impl: one of :data:`ATTENTION_IMPLS`: "auto" (InLine: the fused kernel where it applies,
            :func:`inline_attention`; else as "eager"), "eager" (linear-time / SDPA) or "naive"
            (explicit weights; softmax takes them while ``torch.onnx.export`` traces, see
            :func:`.dispatch.attention_path`). An explicit fused kernel: call :func:`inline_attention`.
    Returns:
        [B, H, Nq, Dv].
    """
    if impl not in ATTENTION_IMPLS:
        if impl in IMPLS:
            raise ValueError(
                f"impl={impl!r} is a fused kernel of the whole InLine layer core (inline_tokens): "
                f"attention() takes one of {ATTENTION_IMPLS}"
            )
        raise ValueError(f"unknown impl {impl!r} for attention(): expected one of {ATTENTION_IMPLS}")
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"unknown attention kind {kind!r}: expected one of {ATTENTION_KINDS}")
    if kind != "softmax" and (bias is not None or mask is not None):
        raise ValueError(f"bias and mask apply to softmax attention only, got kind={kind!r}")
    check_scale(scale, kind)
    if kind == "softmax" and feature_map is not None:
        raise ValueError(f"feature_map applies to inline and linear attention, got {feature_map!r} with kind='softmax'")
    modes = dict(key_padding_mask=key_padding_mask, is_causal=is_causal)
    if dispatch.attention_path(impl, kind) == "naive":
        return naive_attention(q, k, v, kind=kind, feature_map=feature_map, scale=scale, bias=bias, mask=mask, **modes)
    if kind == "inline":
        phi = "identity" if feature_map is None else feature_map
        return inline_attention(q, k, v, feature_map=phi, scale=scale, impl=impl, **modes)
    if kind == "linear":
        return linear_attention(q, k, v, feature_map="relu" if feature_map is None else feature_map, **modes)
    return softmax_attention(q, k, v, scale=scale, bias=bias, mask=mask, **modes)


__all__ = [
    "ATTENTION_IMPLS",
    "InLineState",
    "inline_attention_step",
    "inline_state",
    "check_count",
    "check_feat_size",
    "cpu_kernel_available",
    "cpu_kernel_error",
    "default_impl",
    "grid_residual",
    "inline_tokens",
    "use_impl",
    "why_not_fused",
    "ATTENTION_KINDS",
    "IMPLS",
    "FEATURE_MAPS",
    "FeatureMap",
    "attention",
    "attention_weights",
    "get_feature_map",
    "inline_attention",
    "linear_attention",
    "local_residual",
    "naive_attention",
    "naive_local_residual",
    "softmax_attention",
]
