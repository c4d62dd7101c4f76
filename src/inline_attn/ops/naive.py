"""Naive reference implementations: explicit [N, N] weights, written to mirror the equations.

These are the ground truth the fast paths are tested against (run them in float64) and the
source of attention weights for the analyses. Cost is O(N^2) memory; never use them for speed.

Equations (per head; paper Eq. 2 softmax, Eq. 3 linear, Eq. 5 InLine, Sec. 4.2 local residual):

- softmax: ``w_ij = softmax_j(scale * q_i . k_j + bias_ij)``, ``scale = D**-0.5``
- linear:  ``w_ij = phi(q_i) . phi(k_j) / (sum_s phi(q_i) . phi(k_s) + eps)``
- InLine:  ``w_ij = (1 + scale * phi(q_i) . (phi(k_j) - mean_s phi(k_s))) / N``, ``scale = D**-0.5``
  (the paper's ``phi(q_i).phi(k_j) - mean_s phi(q_i).phi(k_s) + 1/N`` with the reference's
  factor ``scale / N`` folded into phi(q)); every row sums to exactly 1. With a key-padding mask
  and / or causal order the sums and means run over the keys row i sees (N their count; a row
  that sees none is zero): :mod:`.causal` writes them out.
- local residual: ``o_p += sum_{u in 3x3} r_u * v_{p+u}`` per channel, zero padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import check_attention_modes, check_qkv, check_residual, check_scale, check_scores_terms, mapped
from .feature_maps import FeatureMap, get_feature_map

ATTENTION_KINDS = ("inline", "linear", "softmax")


def _softmax_logits(q, k, scale, bias, mask):
    logits = (q @ k.transpose(-2, -1)) * scale
    if bias is not None:
        logits = logits + bias
    if mask is not None:
        if mask.dtype == torch.bool:
            logits = logits.masked_fill(~mask, float("-inf"))
        else:
            logits = logits + mask
    return logits


def allowed_keys(q, k, key_padding_mask=None, is_causal: bool = False) -> torch.Tensor | None:
    """[B, 1, Nq, Nk] bool: the keys each query sees (valid, and ``j <= i`` when causal), or None for all."""
    if key_padding_mask is None and not is_causal:
        return None
    nq, nk = q.shape[2], k.shape[2]
    allowed = torch.ones(q.shape[0], 1, nq, nk, dtype=torch.bool, device=q.device)
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, None, :]
    if is_causal:
        allowed = allowed & torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril()
    return allowed


def _with_allowed(mask: torch.Tensor | None, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax's ``mask`` (None, bool keep-mask or additive float) narrowed to the allowed keys."""
    if mask is None:
        return allowed
    if mask.dtype == torch.bool:
        return mask & allowed
    return mask.masked_fill(~allowed, float("-inf"))


def _inline_weights(q, k, phi, s, allowed):
    """``w_ij = a_ij (1 + s phi(q_i).(phi(k_j) - k_bar_i)) / c_i``: a_ij = 1 for the keys query i sees,
    ``c_i`` their count, ``k_bar_i`` their mean feature (a row with no key: zeros)."""
    pq, pk = mapped(phi, q, "q"), mapped(phi, k, "k")
    if allowed is None:
        a = torch.ones(*q.shape[:3], k.shape[2], dtype=pq.dtype, device=q.device)
    else:
        a = allowed.to(pq.dtype).expand(q.shape[0], q.shape[1], -1, -1)
    count = a.sum(dim=-1, keepdim=True).clamp_min(1)  # [B, H, Nq, 1]
    k_bar = (a @ pk) / count  # [B, H, Nq, D]: the mean of the keys row i sees
    centred = pq @ pk.transpose(-2, -1) - (pq * k_bar).sum(dim=-1, keepdim=True)
    return a * (1.0 + s * centred) / count


def attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    kind: str = "inline",
    feature_map: FeatureMap = None,
    scale: float | None = None,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """The explicit attention weight matrix of one attention kind.

    Args:
        q: [B, H, Nq, D] queries (before the feature map).
        k: [B, H, Nk, D] keys (before the feature map).
        kind: "inline", "linear" or "softmax".
        feature_map: phi for "inline" (default identity) and "linear" (default relu).
        scale: InLine and softmax scale, a positive real; default ``D**-0.5`` (linear attention
            takes none: its row normalisation cancels it).
        bias, mask: softmax only; additive float bias / boolean keep-mask (True = attend) or
            additive float mask, broadcastable to [B, H, Nq, Nk] and on q's device (anything else
            is refused: ValueError).
        key_padding_mask: [B, Nk] bool, True = a padded key: it gets weight 0 and leaves InLine's
            count and mean (every kind).
        is_causal: query i sees keys ``j <= i`` only (``Nq == Nk``; every kind).
        eps: linear attention's denominator guard.

    Returns:
        [B, H, Nq, Nk] weights; softmax and InLine rows sum to 1, except that a query that sees no
        key has a zero row (every kind).
    """
    check_qkv(q, k)
    check_attention_modes(q, k, key_padding_mask, is_causal)
    allowed = allowed_keys(q, k, key_padding_mask, is_causal)
    d = q.shape[-1]
    scale = check_scale(scale, kind)
    if kind == "softmax":
        check_scores_terms(q, k, bias, mask)
        s = d**-0.5 if scale is None else scale
        if allowed is not None:
            mask = _with_allowed(mask, allowed)
        weights = torch.softmax(_softmax_logits(q, k, s, bias, mask), dim=-1)
        return weights if allowed is None else torch.where(allowed, weights, 0.0)
    if bias is not None or mask is not None:
        raise ValueError(f"bias and mask apply to softmax attention only, got kind={kind!r}")
    if kind == "linear":
        phi = get_feature_map("relu" if feature_map is None else feature_map)
        sim = mapped(phi, q, "q") @ mapped(phi, k, "k").transpose(-2, -1)
        if allowed is not None:
            sim = sim * allowed
        # the normaliser in float32 at least: in fp16 its square (the division's gradient) underflows
        wide = torch.promote_types(sim.dtype, torch.float32)
        return (sim / (sim.sum(dim=-1, keepdim=True, dtype=wide) + eps)).to(sim.dtype)
    if kind == "inline":
        s = d**-0.5 if scale is None else scale
        return _inline_weights(q, k, get_feature_map(feature_map), s, allowed)
    raise ValueError(f"unknown attention kind {kind!r}: expected one of {ATTENTION_KINDS}")


def naive_attention(q, k, v, *, kind="inline", **kwargs) -> torch.Tensor:
    """``attention_weights(q, k, kind=kind, ...) @ v``: [B, H, Nq, Dv]."""
    check_qkv(q, k, v)
    return attention_weights(q, k, kind=kind, **kwargs) @ v


def naive_local_residual(v: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-sample, per-channel 3x3 convolution of V laid out as an image (paper Sec. 4.2).

    Args:
        v: [B, C, H, W] values as an image (channel order head-major, as in the output).
        weights: [B, C, 3, 3] predicted residual weights (row-major 3x3 per channel).

    Returns:
        [B, C, H, W], zero padding 1.
    """
    check_residual(v, weights)
    b, c, h, w = v.shape
    padded = F.pad(v, (1, 1, 1, 1))  # zero padding 1
    out = torch.zeros_like(v)
    for dy in range(3):  # row-major 3x3 taps: o_p += r_u * v_{p+u}, u = (dy-1, dx-1)
        for dx in range(3):
            out.addcmul_(weights[:, :, dy, dx, None, None], padded[:, :, dy : dy + h, dx : dx + w])
    return out
