"""The eager implementation (``impl="eager"``): linear-time InLine and linear attention, SDPA softmax,
grouped-conv local residual, in PyTorch ops under autograd.

Each function here has a naive twin in :mod:`inline_attn.ops.naive` and is tested against it
(outputs and gradients, float64, awkward shapes).

Precision: under fp16/bf16 autocast the sums that decide the result (the D x D key-value
product, the key and value means) are taken in float32 and the result is cast back to the
autocast dtype, so large N or large activations cannot overflow or cancel catastrophically.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ._checks import check_attention_modes, check_qkv, check_residual, check_scale, check_scores_terms, mapped
from .feature_maps import FeatureMap, get_feature_map


def autocast_dtype(t: torch.Tensor) -> torch.dtype | None:
    """The autocast dtype on ``t``'s device (fp16 / bf16), or None when autocast is off there."""
    dev = t.device.type
    # meta tensors (shape inference) have no autocast state to ask for
    if dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return None


@contextlib.contextmanager
def float32_region(t: torch.Tensor):
    """Disable autocast on ``t``'s device; yields the dtype the caller should return."""
    low = autocast_dtype(t)
    if low is None:
        yield t.dtype
        return
    with torch.autocast(t.device.type, enabled=False):
        yield low


def as_compute(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the dtype the eager ops sum in: float64 stays float64 (the reference tests), float32
    stays, fp16 / bf16 become float32."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def eager_inline_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    feature_map: FeatureMap = "identity",
    scale: float | None = None,
) -> torch.Tensor:
    """InLine attention in linear time (paper Eq. 5, reference scale convention).

    ``O_i = phi(q_i) M + v_bar`` with ``M = scale/N * sum_j (phi(k_j) - k_bar) v_j^T`` (D x Dv),
    which equals weights ``(1 + scale * phi(q_i).(phi(k_j) - k_bar)) / N`` applied to V.
    Centring keys and values before the product keeps the cancellation out of the sum.

    Args:
        q: [B, H, Nq, D]; k: [B, H, N, D]; v: [B, H, N, Dv] (any strides).
        feature_map: phi; a name (identity, relu, leakyrelu, exp) or a callable.
        scale: defaults to ``D**-0.5``.

    Returns:
        [B, H, Nq, Dv] in q's dtype (the autocast dtype under autocast).
    """
    check_qkv(q, k, v)
    phi = get_feature_map(feature_map)
    n = k.shape[2]
    scale = check_scale(scale)
    s = q.shape[-1] ** -0.5 if scale is None else scale
    with float32_region(q) as out_dtype:
        qf, kf, vf = mapped(phi, as_compute(q), "q"), mapped(phi, as_compute(k), "k"), as_compute(v)
        k_bar = kf.mean(dim=2, keepdim=True)  # [B, H, 1, D]
        v_bar = vf.mean(dim=2, keepdim=True)  # [B, H, 1, Dv]
        # both factors centred: sum_j (k_j - k_bar) v_j^T equals sum_j (k_j - k_bar)(v_j - v_bar)^T,
        # and with V centred too its mean cannot amplify the rounding of the centred keys
        kv = (kf - k_bar).transpose(-2, -1) @ (vf - v_bar)  # [B, H, D, Dv]
        out = torch.matmul(qf, kv.mul_(s / n)).add_(v_bar)
    return out.to(out_dtype)


def eager_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    feature_map: FeatureMap = "relu",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Vanilla linear attention (paper Eq. 3): ``phi(q_i) S / (phi(q_i) . z + eps)``.

    ``S = sum_j phi(k_j) v_j^T``, ``z = sum_j phi(k_j)``. Division-normalised, hence not injective.

    Args:
        q: [B, H, Nq, D]; k: [B, H, N, D]; v: [B, H, N, Dv].
    Returns:
        [B, H, Nq, Dv].
    """
    check_qkv(q, k, v)
    phi = get_feature_map(feature_map)
    with float32_region(q) as out_dtype:
        qf, kf, vf = mapped(phi, as_compute(q), "q"), mapped(phi, as_compute(k), "k"), as_compute(v)
        out = linear_of_features(qf, kf, vf, eps)
    return out.to(out_dtype)


def linear_of_features(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float) -> torch.Tensor:
    """Paper Eq. 3 on mapped features: ``q_i S / (q_i . z + eps)`` with ``S = sum_j k_j v_j^T`` and
    ``z = sum_j k_j``; q = phi(Q) [B, H, Nq, D], k = phi(K) [B, H, N, D], v [B, H, N, Dv] -> [B, H, Nq, Dv].

    Padded keys leave both sums when their rows of k are zero (the masked SDPA-shaped op).
    """
    kv = k.transpose(-2, -1) @ v  # [B, H, D, Dv]
    z = k.sum(dim=2, keepdim=True).transpose(-2, -1)  # [B, H, D, 1]
    return (q @ kv) / (q @ z + eps)


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """Softmax attention through ``F.scaled_dot_product_attention``.

    Args:
        q: [B, H, Nq, D]; k: [B, H, N, D]; v: [B, H, N, Dv].
        scale: defaults to ``D**-0.5``.
        bias: additive float bias broadcastable to [B, H, Nq, N] (e.g. relative position bias).
        mask: boolean keep-mask (True = attend) or additive float mask, broadcastable likewise.
            A bias or mask of another dtype (an integer mask), on another device than q or of a
            shape that does not broadcast is refused (ValueError).
        key_padding_mask: [B, N] bool, True = a padded key; is_causal: query i sees keys ``j <= i``.
            A query that sees no key gets zeros (SDPA's NaN row replaced).
    Returns:
        [B, H, Nq, Dv].
    """
    check_qkv(q, k, v)
    scale = check_scale(scale, "softmax")
    check_attention_modes(q, k, key_padding_mask, is_causal)
    check_scores_terms(q, k, bias, mask)
    if key_padding_mask is None and not is_causal:
        return _sdpa(q, k, v, scale, bias, mask)
    allowed = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
    if is_causal:
        allowed = allowed.tril()
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, None, :]
    seen = allowed.any(dim=-1, keepdim=True)
    allowed = allowed | ~seen  # a row without keys attends to all (no NaN, in the gradient either), then is zeroed
    if mask is not None:
        mask = mask & allowed if mask.dtype == torch.bool else mask.masked_fill(~allowed, float("-inf"))
    out = _sdpa(q, k, v, scale, bias, allowed if mask is None else mask)
    return out.masked_fill(~seen, 0.0)


def _sdpa(q, k, v, scale, bias, mask):
    attn_mask = bias
    if mask is not None:
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
        attn_mask = mask if attn_mask is None else attn_mask + mask
    if attn_mask is not None and attn_mask.dtype != q.dtype and autocast_dtype(q) is None:
        attn_mask = attn_mask.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)


def local_residual(v: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-sample depthwise 3x3 convolution as one grouped convolution (``groups = B*C``).

    Faster than nine shifted multiply-adds (the naive reference's form), even after the NCHW
    copy of V it needs: each shifted multiply-add is a full pass over the tokens and its weight
    gradient a separate reduction (``inline-attn bench residual``; numbers in docs/benchmarks.md).
    ``FlopCounterMode`` counts it as a convolution (9 MACs per output element).

    Args:
        v: [B, C, H, W] (any strides).
        weights: [B, C, 3, 3].
    Returns:
        [B, C, H, W], contiguous (NCHW).
    """
    check_residual(v, weights)
    b, c, h, w = v.shape
    if b * c == 0:  # grouped convolution needs at least one group
        return (v * weights.sum((2, 3))[:, :, None, None]).contiguous()
    out = F.conv2d(v.reshape(1, b * c, h, w), weights.reshape(b * c, 1, 3, 3), padding=1, groups=b * c)
    return out.view(b, c, h, w)
