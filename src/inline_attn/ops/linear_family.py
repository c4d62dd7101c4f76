"""The other vision linear attentions the paper compares InLine with (Sec. 5, Table 6).

Each attention core has a fast linear-time form and explicit weights that mirror its paper's
equation (the naive reference: ``weights @ v``, run it in float64). Per head, ``q, k: [B, h, N, d]``,
``v: [B, h, N, dv]``; weights ``[B, h, N, N]``.

- Hydra (Bolya et al. 2022, Eq. 5-6): as many heads as channels, cosine feature map
  ``phi(x) = x / ||x||`` over all C channels; ``O_c = phi(Q)_c * sum_j phi(K_j)_c V_jc``, so the
  weights of channel c are ``w_ij = phi(q_i)_c phi(k_j)_c`` (no normalisation of rows).
- Efficient attention (Shen et al. 2021, Eq. 4): ``E = rho_q(Q) (rho_k(K)^T V)`` with
  ``rho_q`` a softmax over each query's d features and ``rho_k`` a softmax over the N tokens of
  each key feature; ``w_ij = sum_d softmax_d(q_i)_d softmax_N(k_d)_j`` (rows sum to 1).
- Linear-angular (Castling-ViT, You et al. 2023, Eq. 3-4): ``Sim(q, k) = 1 - angle(q, k) / pi``
  linearised to ``1/2 + q_hat . k_hat / pi``; the authors' code keeps the constant on the query's
  own value, ``w_ij = delta_ij / 2 + q_hat_i . k_hat_j / pi``, and L2-normalises each output row.
- ReLU linear attention (EfficientViT, Cai et al. 2023, Eq. 2) is :func:`..fast.linear_attention`
  with the ReLU feature map; its multi-scale aggregation lives in the layer.
- Focused linear attention (FLatten, Han et al. 2023, Eq. 5-6): the focusing map
  ``f_p(x) = ||x|| / ||x**p|| * x**p`` of ``relu(x) / s`` over all C channels, then linear
  attention with those features (:func:`focused_features`).

- Agent attention (Han et al. 2024, Eq. 3): ``softmax(Q A^T / sqrt(d) + B2) softmax(A K^T / sqrt(d) + B1) V``
  with n agent tokens A pooled from Q (:func:`agent_attention`, :func:`agent_weights`).
- PolaFormer (Meng et al. 2025, Eq. 9-11) and MLLA (Han et al. 2024): linear attention normalised
  as the authors' code, ``q (K^T V / N) / (q' . mean_j k'_j + 1e-6)``, with the normaliser folded
  into the queries (:func:`mean_normalised_queries`, then :func:`dot_attention` / :func:`dot_weights`);
  PolaFormer's sign split and power (:func:`polarity_features`), MLLA's 2-D RoPE (:func:`rope_2d`).

The depthwise convolutions some of them add (FLatten's DWC, Castling-ViT's sequence conv,
EfficientViT's aggregation) have naive twins here: :func:`naive_depthwise_conv2d`,
:func:`naive_grouped_pointwise`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._checks import check_qkv
from .eager import as_compute, float32_region


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


# --- Agent attention, PolaFormer, MLLA ------------------------------------------------------


def agent_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    agents: torch.Tensor,
    key_bias: torch.Tensor,
    query_bias: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Agent attention's explicit weights (Han et al., ECCV 2024, Eq. 3): the broadcast times the aggregation.

    q: [B, h, N, d], k: [B, h, N, d], agents A: [B, h, n, d]; key_bias B1: [B or 1, h, n, N];
    query_bias B2: [B or 1, h, N, n]; scale: ``d ** -0.5`` ->
    ``softmax(s Q A^T + B2) softmax(s A K^T + B1)`` [B, h, N, N] (rows sum to 1: a product of two
    row-stochastic matrices).
    """
    check_qkv(q, k)
    aggregate = torch.softmax((agents * scale) @ k.transpose(-2, -1) + key_bias, dim=-1)  # [B, h, n, N]
    broadcast = torch.softmax((q * scale) @ agents.transpose(-2, -1) + query_bias, dim=-1)  # [B, h, N, n]
    return broadcast @ aggregate


def agent_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    agents: torch.Tensor,
    key_bias: torch.Tensor,
    query_bias: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Agent attention in O(N n d): the n agents aggregate the values, then broadcast them to the queries.

    Arguments as :func:`agent_weights`, v: [B, h, N, dv] -> [B, h, N, dv]:
    ``softmax(s Q A^T + B2) (softmax(s A K^T + B1) V)``.
    """
    check_qkv(q, k, v)
    with float32_region(q) as out_dtype:  # the aggregation sums N values: float32 under autocast
        q, k, v, agents = (as_compute(t) for t in (q, k, v, agents))
        aggregate = torch.softmax((agents * scale) @ k.transpose(-2, -1) + key_bias.to(k.dtype), dim=-1)
        agent_v = aggregate @ v  # [B, h, n, dv]
        out = torch.softmax((q * scale) @ agents.transpose(-2, -1) + query_bias.to(q.dtype), dim=-1) @ agent_v
    return out.to(out_dtype)


def naive_adaptive_avg_pool2d(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Adaptive average pooling written out: x [B, C, H, W] -> [B, C, oh, ow]; output cell (i, j)
    averages rows ``floor(i H / oh) .. ceil((i + 1) H / oh) - 1`` and the like for columns (cells
    overlap, or repeat an input pixel, when H is not a multiple of oh)."""
    h, w = x.shape[2:]
    oh, ow = size
    rows = []
    for i in range(oh):
        r0, r1 = (i * h) // oh, -(-((i + 1) * h) // oh)
        cols = []
        for j in range(ow):
            c0, c1 = (j * w) // ow, -(-((j + 1) * w) // ow)
            cols.append(x[:, :, r0:r1, c0:c1].mean(dim=(2, 3)))
        rows.append(torch.stack(cols, dim=-1))
    return torch.stack(rows, dim=-2)


def dot_weights(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Unnormalised linear attention weights ``Q K^T``: [B, h, N, d] each -> [B, h, N, N] (the
    normaliser is already in q: :func:`mean_normalised_queries`)."""
    check_qkv(q, k)
    return q @ k.transpose(-2, -1)


def dot_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``Q (K^T V)`` in O(N d dv): [B, h, N, d], [B, h, N, d], [B, h, N, dv] -> [B, h, N, dv]."""
    check_qkv(q, k, v)
    with float32_region(q) as out_dtype:  # K^T V sums N products: float32 under autocast
        out = as_compute(q) @ (as_compute(k).transpose(-2, -1) @ as_compute(v))
    return out.to(out_dtype)


def mean_normalised_queries(
    q_num: torch.Tensor, q_den: torch.Tensor, k_den: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """The queries of the linear attention of PolaFormer and MLLA with their normaliser folded in.

    Both authors' codes compute ``O_i = q_i (K^T V / N) z_i`` with ``z_i = 1 / (q'_i . mean_j k'_j + eps)``
    (``q_num = q_den`` for PolaFormer; MLLA's numerator carries RoPE, its normaliser does not).
    Returns ``q_num * z / N`` [B, h, N, d], so that ``dot_weights(result, k)`` are the explicit weights
    and ``dot_attention(result, k, v)`` the output. q_den, k_den: [B, h, N, d'].
    """
    n = k_den.shape[2]
    with float32_region(q_num) as out_dtype:  # the key mean sums N features: float32 under autocast
        k_mean = as_compute(k_den).mean(dim=2, keepdim=True)
        z = 1.0 / (as_compute(q_den) @ k_mean.transpose(-2, -1) + eps)  # [B, h, N, 1]
        out = as_compute(q_num) * (z / n)
    return out.to(out_dtype)


def polarity_features(x: torch.Tensor, power: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """PolaFormer's polarity split with its power (focusing) function (Meng et al., ICLR 2025, Eq. 9-11).

    x: [..., d]; power: broadcastable to x (> 1) -> ``(relu(x) ** p, relu(-x) ** p)``, the positive
    and negative parts, each sharpened elementwise.
    """
    return F.relu(x) ** power, F.relu(-x) ** power


def rope_2d(x: torch.Tensor, feat_size: tuple[int, int], num_prefix_tokens: int = 0, base: float = 10000.0):
    """MLLA's 2-D rotary position embedding over all C channels of the tokens (the authors' ``RoPE``).

    x: [B, P + H*W, C]. Channel pairs ``(2m, 2m+1)`` are complex numbers; with ``K = C // 4``
    frequencies ``theta_k = base ** (-k / K)``, pair m < K turns by ``row * theta_m`` and pair
    K <= m < 2K by ``col * theta_(m-K)``. Channels past ``4K`` (when 4 does not divide C) and prefix
    tokens (no grid position) are not rotated.
    """
    b, n, c = x.shape
    h, w = feat_size
    kmax = c // 4
    if kmax == 0:
        return x
    dt = torch.promote_types(x.dtype, torch.float32)  # angles of far positions need float32 (as the authors')
    theta = base ** (-torch.arange(kmax, dtype=dt, device=x.device) / kmax)  # [K]
    rows = torch.arange(h, dtype=dt, device=x.device)[:, None].expand(h, w).reshape(-1)
    cols = torch.arange(w, dtype=dt, device=x.device)[None, :].expand(h, w).reshape(-1)
    angle = torch.cat([rows[:, None] * theta, cols[:, None] * theta], dim=-1)  # [HW, 2K]
    zero = torch.zeros(num_prefix_tokens, 2 * kmax, dtype=dt, device=x.device)
    angle = torch.cat([zero, angle], dim=0)  # [N, 2K]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    pairs = x[..., : 4 * kmax].reshape(b, n, 2 * kmax, 2)
    re, im = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1).reshape(b, n, 4 * kmax)
    return torch.cat([rotated, x[..., 4 * kmax :]], dim=-1)
