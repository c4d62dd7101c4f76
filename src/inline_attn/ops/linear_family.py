"""The other vision linear attentions the paper compares InLine with (Sec. 5, Table 6).

Each attention core has a fast linear-time form and explicit weights that mirror its paper's
equation (the naive reference: ``weights @ v``, run it in float64). Per head, ``q, k: [B, h, N, d]``,
``v: [B, h, N, dv]``; weights ``[B, h, N, N]``.

- Hydra (Bolya et al. 2022, Eq. 5-6): as many heads as channels, cosine kernel
  ``phi(x) = x / ||x||`` over all C channels; ``O_c = phi(Q)_c * sum_j phi(K_j)_c V_jc``, so the
  weights of channel c are ``w_ij = phi(q_i)_c phi(k_j)_c`` (no normalisation of rows).
- Efficient attention (Shen et al. 2021, Eq. 4): ``E = rho_q(Q) (rho_k(K)^T V)`` with
  ``rho_q`` a softmax over each query's d features and ``rho_k`` a softmax over the N tokens of
  each key feature; ``w_ij = sum_d softmax_d(q_i)_d softmax_N(k_d)_j`` (rows sum to 1).
- Linear-angular (Castling-ViT, You et al. 2023, Eq. 3-4): ``Sim(q, k) = 1 - angle(q, k) / pi``
  linearised to ``1/2 + q_hat . k_hat / pi``; the authors' code keeps the constant on the query's
  own value, ``w_ij = delta_ij / 2 + q_hat_i . k_hat_j / pi``, and L2-normalises each output row.
- ReLU linear attention (EfficientViT, Cai et al. 2023, Eq. 2) is :func:`..fast.linear_attention`
  with the ReLU kernel; its multi-scale aggregation lives in the layer.
- Focused linear attention (FLatten, Han et al. 2023, Eq. 5-6): the focusing map
  ``f_p(x) = ||x|| / ||x**p|| * x**p`` of ``relu(x) / s`` over all C channels, then linear
  attention with those features (:func:`focused_features`).

The depthwise convolutions some of them add (FLatten's DWC, Castling-ViT's sequence conv,
EfficientViT's aggregation) have naive twins here: :func:`naive_depthwise_conv2d`,
:func:`naive_grouped_pointwise`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._checks import check_qkv


def l2_normalise(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """``x / max(||x||, eps)`` over the last dim: a zero vector (a padding token of a window) stays
    zero instead of becoming NaN; any other vector gets unit length."""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


def hydra_weights(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q, k: [B, C, N, 1] (already ``phi``-mapped, one channel per head) -> [B, C, N, N]."""
    check_qkv(q, k)
    return q @ k.transpose(-2, -1)


def hydra_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Hydra's core in O(NC): q, k, v [B, C, N, 1] -> ``q * sum_j k_j v_j`` [B, C, N, 1]."""
    check_qkv(q, k, v)
    return q * (k * v).sum(dim=2, keepdim=True)


def efficient_weights(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[B, h, N, d] each -> [B, h, N, N]: ``softmax_d(Q) softmax_N(K)^T``."""
    check_qkv(q, k)
    return torch.softmax(q, dim=-1) @ torch.softmax(k, dim=2).transpose(-2, -1)


def efficient_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Efficient attention: ``softmax_d(Q) (softmax_N(K)^T V)``, [B, h, N, dv]."""
    check_qkv(q, k, v)
    context = torch.softmax(k, dim=2).transpose(-2, -1) @ v  # [B, h, d, dv]
    return torch.softmax(q, dim=-1) @ context


def angular_weights(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[B, h, N, d] each -> [B, h, N, N]: ``I / 2 + q_hat k_hat^T / pi`` (self-attention: Nq = N)."""
    check_qkv(q, k)
    n = k.shape[2]
    if q.shape[2] != n:
        raise ValueError(f"linear-angular attention is self-attention: q has {q.shape[2]} tokens, k has {n}")
    eye = torch.eye(n, dtype=q.dtype, device=q.device)
    return 0.5 * eye + (l2_normalise(q) @ l2_normalise(k).transpose(-2, -1)) / math.pi


def angular_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Linear-angular core: ``v / 2 + q_hat (k_hat^T v) / pi``, [B, h, N, dv] (before the row norm)."""
    check_qkv(q, k, v)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"linear-angular attention is self-attention: q has {q.shape[2]} tokens, k has {k.shape[2]}")
    return 0.5 * v + (l2_normalise(q) @ (l2_normalise(k).transpose(-2, -1) @ v)) / math.pi


def focused_features(x: torch.Tensor, scale: torch.Tensor, power: float) -> torch.Tensor:
    """FLatten's focused feature map over the last dim: x [..., C], scale [C] (> 0) -> [..., C].

    ``y = relu(x) / scale + 1e-6`` (the offset keeps every norm positive), then
    ``f_p(y) = ||y|| / ||y**p|| * y**p``: the direction sharpened towards the largest features,
    the length kept. Computed in the wider of x's and scale's dtypes (the power and the norms in
    float32 under autocast), returned in x's dtype, as the other kinds' features.
    """
    y = F.relu(x) / scale + 1e-6
    yp = y**power
    return (yp * (y.norm(dim=-1, keepdim=True) / yp.norm(dim=-1, keepdim=True))).to(x.dtype)


def naive_depthwise_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Depthwise convolution as shifted multiply-adds, zero padding ``(kh // 2, kw // 2)``.

    x: [B, C, H, W]; weight: [C, 1, kh, kw] (odd sizes); bias: [C] or None -> [B, C, H, W].
    """
    b, c, h, w = x.shape
    if weight.dim() != 4 or weight.shape[:2] != (c, 1) or weight.shape[2] % 2 == 0 or weight.shape[3] % 2 == 0:
        raise ValueError(f"weight must be [C={c}, 1, kh, kw] with odd kh, kw, got {tuple(weight.shape)}")
    kh, kw = weight.shape[2:]
    padded = F.pad(x, (kw // 2, kw // 2, kh // 2, kh // 2))
    out = torch.zeros_like(x)
    for dy in range(kh):  # out_p = sum_u w_u x_{p + u - k//2}
        for dx in range(kw):
            out = out + weight[:, 0, dy, dx, None, None] * padded[:, :, dy : dy + h, dx : dx + w]
    return out if bias is None else out + bias[:, None, None]


def naive_grouped_pointwise(x: torch.Tensor, weight: torch.Tensor, groups: int) -> torch.Tensor:
    """1x1 grouped convolution without bias: x [B, C, H, W], weight [C_out, C / groups, 1, 1]."""
    b, c, h, w = x.shape
    co = weight.shape[0]
    xg = x.reshape(b, groups, c // groups, h * w)
    wg = weight.reshape(groups, co // groups, c // groups)
    out = torch.zeros(b, groups, co // groups, h * w, dtype=x.dtype, device=x.device)
    for g in range(groups):  # out[g] = W_g x[g], one group at a time as the definition reads
        out[:, g] = wg[g] @ xg[:, g]
    return out.reshape(b, co, h, w)
