"""Input validation shared by the ops: clear ValueErrors instead of shape errors deep inside."""

from __future__ import annotations

import math
import numbers
import operator

import torch


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None) -> None:
    """q: [B, H, Nq, D], k: [B, H, Nk, D], v: [B, H, Nk, Dv]: float tensors of one dtype on one device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t is None:
            continue
        check_tensor(name, t)
        if t.dtype != q.dtype:
            raise ValueError(f"q, k and v must share one dtype, got q {q.dtype} and {name} {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"q, k and v must be on one device, got q on {q.device} and {name} on {t.device}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have rank 4 [batch, heads, tokens, head_dim], got shape {tuple(t.shape)}")
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch, heads and head_dim")
    if k.shape[2] == 0:
        raise ValueError("k has no tokens: expected at least one key")
    if q.shape[-1] == 0:
        raise ValueError(f"q and k have head_dim 0 (shape {tuple(q.shape)}): expected head_dim >= 1")
    if v is not None and (v.shape[:3] != k.shape[:3]):
        raise ValueError(f"v {tuple(v.shape)} must agree with k {tuple(k.shape)} in batch, heads and tokens")


def check_residual(v, weights) -> None:
    """v: [B, C, H, W] and weights: [B, C, 3, 3], float tensors of one dtype on one device."""
    check_tensor("v", v)
    check_tensor("weights", weights)
    if v.dim() != 4:
        raise ValueError(f"v must be [B, C, H, W], got shape {tuple(v.shape)}")
    if weights.shape != (*v.shape[:2], 3, 3):
        raise ValueError(f"weights must have shape {(*v.shape[:2], 3, 3)}, got {tuple(weights.shape)}")
    if weights.dtype != v.dtype or weights.device != v.device:
        raise ValueError(
            f"v and weights must share one dtype and device, got v {v.dtype} on {v.device} and weights "
            f"{weights.dtype} on {weights.device}"
        )


def as_int(value):
    """``value`` as an int when it is an integer (Python, numpy, a symbolic size; never a bool or a
    float, which a size must not be silently truncated from), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, torch.SymInt):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_count(name: str, value, minimum: int = 0) -> int:
    """An integer ``value >= minimum`` (see :func:`as_int`), or a ValueError naming it."""
    n = as_int(value)
    if n is None:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r} ({type(value).__name__})")
    if n < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {n}")
    return n


def check_feat_size(feat_size, num_tokens: int, num_prefix_tokens: int = 0) -> tuple[int, int]:
    """Validate ``feat_size=(H, W)`` (ints) against a token count ``N = num_prefix_tokens + H*W``."""
    if type(feat_size) is tuple and len(feat_size) == 2 and type(feat_size[0]) is type(feat_size[1]) is int:
        h, w = feat_size  # a layer's (H, W): nothing to convert (checked on every layer call)
    else:
        h, w = _int_pair(feat_size)
    if h <= 0 or w <= 0:
        raise ValueError(f"feat_size must be positive, got H={h}, W={w}")
    if type(num_prefix_tokens) is not int or num_prefix_tokens < 0:
        num_prefix_tokens = check_count("num_prefix_tokens", num_prefix_tokens)
    if num_tokens != num_prefix_tokens + h * w:
        raise ValueError(
            f"token count N={num_tokens} does not match num_prefix_tokens + H*W = "
            f"{num_prefix_tokens} + {h}*{w} = {num_prefix_tokens + h * w}"
        )
    return h, w


def _int_pair(feat_size) -> tuple[int, int]:
    try:
        sides = tuple(as_int(s) for s in feat_size)
    except TypeError:
        sides = ()
    if len(sides) != 2 or None in sides:
        raise ValueError(f"feat_size must be a pair (H, W) of ints, got {feat_size!r}")
    return sides


def check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise ValueError(f"{name} must have a floating-point dtype, got {t.dtype}")


def check_tokens(q, k, v, residual_weights=None) -> None:
    """q, k, v: [B, N, C] tensors of one float dtype on one device; residual_weights: None or a
    float [B, C, 3, 3] tensor on the same device (its dtype may differ: it is cast)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t)
        if t.dim() != 3:
            raise ValueError(f"{name} must be [B, N, C], got shape {tuple(t.shape)}")
        if t.shape != q.shape:
            raise ValueError(f"{name} must have q's shape {tuple(q.shape)}, got {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise ValueError(f"q, k and v must share one dtype, got q {q.dtype} and {name} {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"q, k and v must be on one device, got q on {q.device} and {name} on {t.device}")
    if residual_weights is not None:
        check_tensor("residual_weights", residual_weights)
        b, _, c = q.shape
        if residual_weights.shape != (b, c, 3, 3):
            raise ValueError(
                f"residual_weights must be [B, C, 3, 3] = {(b, c, 3, 3)}, got {tuple(residual_weights.shape)}"
            )
        if residual_weights.device != q.device:
            raise ValueError(f"residual_weights must be on q's device {q.device}, got {residual_weights.device}")


def check_num_heads(num_heads, channels: int) -> int:
    """num_heads: a positive integer (see :func:`as_int`) dividing ``channels`` (> 0) -> num_heads
    as an int."""
    n = as_int(num_heads)
    if n is None:
        raise ValueError(f"num_heads must be an int, got {num_heads!r} ({type(num_heads).__name__})")
    if channels <= 0:
        raise ValueError(f"the channel count C must be positive, got C={channels}")
    if n <= 0 or channels % n != 0:
        raise ValueError(f"C={channels} must be a positive multiple of num_heads={n}")
    return n


def cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)``, without the call when t has that dtype: a no-op ``to`` still costs a
    dispatch (~0.5 us), and a fused layer step made two dozen of them."""
    return t if t.dtype == dtype else t.to(dtype)


def check_scale(scale, kind: str = "inline") -> float | None:
    """``scale`` of an attention ``kind``: None (the default, ``head_dim**-0.5``) or a positive finite
    real number, returned as a float; linear attention takes none (its row normalisation cancels any
    scale, so a given one would be silently ignored)."""
    if scale is None:
        return scale
    if kind == "linear":
        raise ValueError(
            f"scale={scale!r}: linear attention takes no scale (its row normalisation cancels it); pass scale=None"
        )
    if isinstance(scale, torch.SymFloat) or torch.compiler.is_compiling():
        # Traced code: Dynamo makes a float that changed between compiles a symbolic one (automatic
        # dynamic), and math.isfinite of it breaks the graph; the eager call checks the same value.
        return scale
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale={scale!r}: expected a positive real number, or None for head_dim**-0.5")
    return float(scale)


def mapped(phi, x: torch.Tensor, name: str) -> torch.Tensor:
    """``phi(x)``, checked to be a tensor of ``x``'s shape: a feature map is applied per element or
    per token, and one that changed the head dim would pair queries and keys wrongly."""
    y = phi(x)
    phi_name = getattr(phi, "__name__", type(phi).__name__)
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(
            f"feature_map {phi_name} turned {name} of shape {tuple(x.shape)} into {got}: a feature map must keep "
            f"the shape"
        )
    if not y.is_floating_point():
        raise ValueError(f"feature_map {phi_name} must return a floating tensor, got {y.dtype} for {name}")
    return y


def check_attention_modes(q: torch.Tensor, k: torch.Tensor, key_padding_mask, is_causal) -> None:
    """The modes of the SDPA-shaped ops: ``key_padding_mask`` None or a bool [B, Nk] tensor on q's
    device; ``is_causal`` a bool, True only for ``Nq == Nk`` (query i sees keys ``j <= i``)."""
    if not isinstance(is_causal, bool):
        raise ValueError(f"is_causal must be a bool, got {is_causal!r}")
    if is_causal and q.shape[2] != k.shape[2]:
        raise ValueError(
            f"is_causal=True needs as many queries as keys (query i sees keys 0..i), got Nq={q.shape[2]} and "
            f"Nk={k.shape[2]}; to extend a sequence token by token use inline_attention_step"
        )
    if key_padding_mask is None:
        return
    if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool:
        got = key_padding_mask.dtype if isinstance(key_padding_mask, torch.Tensor) else type(key_padding_mask).__name__
        raise ValueError(f"key_padding_mask must be a bool tensor (True = padding), got {got}")
    expected = (k.shape[0], k.shape[2])
    if tuple(key_padding_mask.shape) != expected:
        raise ValueError(f"key_padding_mask must be [B, Nk] = {expected}, got {tuple(key_padding_mask.shape)}")
    if key_padding_mask.device != q.device:
        raise ValueError(f"key_padding_mask must be on q's device {q.device}, got {key_padding_mask.device}")


def check_scores_terms(q: torch.Tensor, k: torch.Tensor, bias, mask) -> None:
    """Softmax's ``bias`` and ``mask``, each None or a tensor on q's device broadcastable to the
    scores [B, H, Nq, Nk]: a floating bias (added to the scores), a bool keep-mask (True = attend)
    or a floating mask (added to the scores). An integer mask is refused rather than read as either:
    SDPA refuses one too, and 0 / 1 added to the scores would silently keep every key."""
    scores = (*q.shape[:3], k.shape[2])
    for name, t in (("bias", bias), ("mask", mask)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not (t.is_floating_point() or (name == "mask" and t.dtype == torch.bool)):
            wanted = "bool (True = attend) or floating" if name == "mask" else "floating"
            raise ValueError(f"{name} must be {wanted} (added to the scores), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
        if t.dim() > 4 or any(a != 1 and a != b for a, b in zip(reversed(t.shape), reversed(scores))):
            raise ValueError(f"{name} of shape {tuple(t.shape)} must broadcast to the scores [B, H, Nq, Nk] = {scores}")
