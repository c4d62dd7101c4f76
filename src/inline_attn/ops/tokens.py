"""The InLine layer core on token-major tensors: attention over all heads plus the local residual.

``O = concat_heads(InLine(Q_h, K_h, V_h)) + residual(V)`` with Q, K, V: [B, N, C] (views into the
qkv projection, heads as contiguous channel blocks) and the predicted 3x3 residual (paper
Sec. 4.2) added on the H x W grid tokens (not on the prefix tokens). Three implementations:

- ``naive``: explicit N x N weights (:func:`attention_weights`) and nine shifted multiply-adds.
- ``eager``: :func:`inline_attention` per head and the grouped-convolution residual.
- ``fast`` (default): the fused CPU kernels (:mod:`.cpu_kernel`, forward and backward) where they
  apply (float32 / float64 CPU tensors, identity kernel, no autocast, not under
  ``torch.compile``), else ``eager``.
"""
from __future__ import annotations

import torch

from . import cpu_kernel
from ._checks import check_feat_size
from .fast import inline_attention, local_residual
from .kernels import Kernel
from .naive import naive_attention, naive_local_residual

TOKEN_IMPLS = ("fast", "eager", "naive")


def add_to_grid_tokens(out: torch.Tensor, res: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """out: [B, P + HW, C] plus res: [B, HW, C] on the grid tokens; prefix tokens untouched."""
    if num_prefix_tokens == 0:
        return out + res
    return torch.cat([out[:, :num_prefix_tokens], out[:, num_prefix_tokens:] + res], dim=1)


def apply_local_residual(v_img: torch.Tensor, weights: torch.Tensor, impl: str = "fast") -> torch.Tensor:
    """v_img [B, C, H, W], weights [B, C, 3, 3] -> [B, C, H, W]: the grouped convolution, or the
    nine shifted multiply-adds for ``impl="naive"``; weights are cast to V's dtype."""
    fn = naive_local_residual if impl == "naive" else local_residual
    return fn(v_img, weights.to(v_img.dtype))


def grid_residual(
    v: torch.Tensor,
    weights: torch.Tensor,
    feat_size: tuple[int, int],
    num_prefix_tokens: int = 0,
    impl: str = "fast",
) -> torch.Tensor:
    """The 3x3 local residual of token-major values: v [B, P + H*W, C] -> [B, H*W, C] (a view).

    weights: [B, C, 3, 3]. ``impl="naive"`` uses the nine shifted multiply-adds, any other value
    the grouped convolution.
    """
    b, _, c = v.shape
    h, w = feat_size
    v_img = v[:, num_prefix_tokens:].reshape(b, h, w, c).permute(0, 3, 1, 2)  # [B, C, H, W] view
    return apply_local_residual(v_img, weights, impl).flatten(2).transpose(1, 2)


def _use_cpu_kernel(q, k, v, weights, kernel) -> bool:
    tensors = [t for t in (q, k, v, weights) if t is not None]
    return (
        kernel in (None, "identity")
        and cpu_kernel.cpu_kernel_enabled()
        and q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.float64)
        and all(t.dtype == q.dtype and t.device == q.device for t in tensors)
        and all(t.stride(-1) == 1 for t in (q, k, v))
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and cpu_kernel.cpu_kernel_available()
    )


def inline_tokens(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_heads: int,
    feat_size: tuple[int, int],
    residual_weights: torch.Tensor | None = None,
    num_prefix_tokens: int = 0,
    kernel: Kernel = None,
    scale: float | None = None,
    impl: str = "fast",
) -> torch.Tensor:
    """InLine attention over ``num_heads`` heads plus the local residual, token-major.

    Args:
        q, k, v: [B, N, C] with ``N = num_prefix_tokens + H*W`` (any strides; views into a fused
            qkv projection are read in place by the fused kernel).
        num_heads: h; head i owns channels ``[i*C/h, (i+1)*C/h)``.
        feat_size: (H, W) of the grid tokens.
        residual_weights: [B, C, 3, 3] predicted residual kernels, or None for no residual.
        num_prefix_tokens: tokens before the grid (a cls token): attended to, no residual.
        kernel: phi (default identity); scale: default ``(C/h)**-0.5``.
        impl: "fast", "eager" or "naive" (see the module docstring).

    Returns:
        [B, N, C]: ``O_i = phi(q_i) M + v_bar`` per head (paper Eq. 5) plus the residual.
    """
    if impl not in TOKEN_IMPLS:
        raise ValueError(f"unknown impl {impl!r}: expected one of {TOKEN_IMPLS}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3 or t.shape != q.shape:
            raise ValueError(f"{name} must be [B, N, C] like q {tuple(q.shape)}, got {tuple(t.shape)}")
    b, n, c = q.shape
    if num_heads <= 0 or c % num_heads != 0:
        raise ValueError(f"C={c} must be a positive multiple of num_heads={num_heads}")
    h, w = check_feat_size(feat_size, n, num_prefix_tokens)
    if residual_weights is not None and residual_weights.shape != (b, c, 3, 3):
        raise ValueError(f"residual_weights must be [B, C, 3, 3] = {(b, c, 3, 3)}, got {tuple(residual_weights.shape)}")
    d = c // num_heads
    s = d ** -0.5 if scale is None else scale

    if impl == "fast" and _use_cpu_kernel(q, k, v, residual_weights, kernel):
        return cpu_kernel.inline_forward_cpu(
            q, k, v, residual_weights, num_heads=num_heads, scale=s, feat_size=(h, w), num_prefix_tokens=num_prefix_tokens
        )
    qh, kh, vh = (t.reshape(b, n, num_heads, d).transpose(1, 2) for t in (q, k, v))  # [B, h, N, d]
    if impl == "naive":
        out = naive_attention(qh, kh, vh, kind="inline", kernel=kernel, scale=s)
    else:
        out = inline_attention(qh, kh, vh, kernel="identity" if kernel is None else kernel, scale=s)
    out = out.transpose(1, 2).reshape(b, n, c)
    if residual_weights is None:
        return out
    res = grid_residual(v, residual_weights, (h, w), num_prefix_tokens, impl=impl)
    return add_to_grid_tokens(out, res, num_prefix_tokens)
