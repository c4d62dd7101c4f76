"""Input validation shared by the ops: clear ValueErrors instead of shape errors deep inside."""
from __future__ import annotations

import torch


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None) -> None:
    """q: [B, H, Nq, D], k: [B, H, Nk, D], v: [B, H, Nk, Dv]."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t is not None and t.dim() != 4:
            raise ValueError(
                f"{name} must have rank 4 [batch, heads, tokens, head_dim], got shape {tuple(t.shape)}"
            )
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch, heads and head_dim"
        )
    if k.shape[2] == 0:
        raise ValueError("k has no tokens: expected at least one key")
    if v is not None and (v.shape[:3] != k.shape[:3]):
        raise ValueError(
            f"v {tuple(v.shape)} must agree with k {tuple(k.shape)} in batch, heads and tokens"
        )


def check_feat_size(feat_size, num_tokens: int, num_prefix_tokens: int = 0) -> tuple[int, int]:
    """Validate ``feat_size=(H, W)`` against a token count ``N = num_prefix_tokens + H*W``."""
    try:
        h, w = (int(s) for s in feat_size)
    except (TypeError, ValueError):
        raise ValueError(f"feat_size must be a pair (H, W) of ints, got {feat_size!r}") from None
    if h <= 0 or w <= 0:
        raise ValueError(f"feat_size must be positive, got H={h}, W={w}")
    if num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be >= 0, got {num_prefix_tokens}")
    if num_tokens != num_prefix_tokens + h * w:
        raise ValueError(
            f"token count N={num_tokens} does not match num_prefix_tokens + H*W = "
            f"{num_prefix_tokens} + {h}*{w} = {num_prefix_tokens + h * w}"
        )
    return h, w
