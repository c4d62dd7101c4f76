"""The other linear attentions as cores of :class:`~inline_attn.layers.TokenAttention`.

A core turns the projected ``q, k, v: [B, N, C]`` (``N = P + H*W``, P prefix tokens first) into the
attention output ``[B, N, C]`` before the shared output projection, so every family takes these
kinds wherever it takes ``"inline"`` (pattern letters in :mod:`inline_attn.models._helpers`).
Equations and the op-level eager / naive pairs: :mod:`inline_attn.ops.linear_family`.

Each core runs in three steps: ``prepare`` (feature maps and spatial mixing on [B, N, C]),
the attention (linear-time ``eager``, or explicit ``weights`` then ``weights @ v`` for the naive
reference and for attention hooks), ``finish`` (the terms added after the attention). Spatial
operators act on the H x W grid tokens only; prefix tokens (a cls token) have no neighbours.

Where a paper's module needs a fixed token count (FLatten's learned positional encoding on K) or
a batch norm (EfficientViT's projection) it is left out: the models bring their own position
embeddings and norms. Choices the papers leave open follow the authors' public code and are
named in each class.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import attention_weights, linear_attention
from ..ops import linear_family as lf
from ..ops.tokens import add_to_grid_tokens
from .common import trunc_normal_


def _heads(t: torch.Tensor, h: int) -> torch.Tensor:
    """[B, N, C] -> [B, h, N, C/h] view."""
    b, n, c = t.shape
    return t.reshape(b, n, h, c // h).transpose(1, 2)


def _tokens(t: torch.Tensor) -> torch.Tensor:
    """[B, h, N, d] -> [B, N, h*d]."""
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def _grid(t: torch.Tensor, feat_size: tuple[int, int], p: int) -> torch.Tensor:
    """Grid tokens of [B, P + H*W, C] as an image [B, C, H, W]."""
    b, _, c = t.shape
    h, w = feat_size
    return t[:, p:].reshape(b, h, w, c).permute(0, 3, 1, 2)


def _ungrid(img: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, H*W, C]."""
    return img.flatten(2).transpose(1, 2)


def _pad_prefix(grid_tokens: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
    """Prefix tokens [B, P, C] before grid tokens [B, H*W, C]."""
    return grid_tokens if prefix.shape[1] == 0 else torch.cat([prefix, grid_tokens], dim=1)


def _depthwise(x: torch.Tensor, conv: nn.Conv2d, naive: bool) -> torch.Tensor:
    """A depthwise ``conv`` (zero padding k // 2) by the conv op, or by shifted multiply-adds."""
    if naive:
        return lf.naive_depthwise_conv2d(x, conv.weight, conv.bias)
    return conv(x)


class LinearCore(nn.Module):
    """Base of the cores: ``prepare -> (eager | weights @ v) -> finish``; see the module docstring."""

    kind: str = ""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.dim, self.num_heads = dim, num_heads

    def attn_heads(self) -> int:
        """Heads of the attention step (the rows of its weights per sample)."""
        return self.num_heads

    def prepare(self, q, k, v, feat_size, p, naive):
        return q, k, v

    def weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def eager(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The linear-time attention step: per head q, k: [B, h, N, d], v: [B, h, N, dv] -> [B, h, N, dv]."""
        raise NotImplementedError

    def finish(self, out, v, feat_size, p, naive):
        return out

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        feat_size: tuple[int, int],
        num_prefix_tokens: int = 0,
        *,
        impl: str = "eager",
        weight_hook=None,
    ) -> torch.Tensor:
        """q, k, v: [B, N, C] -> [B, N, C].

        impl: "eager" (linear-time attention, convolution ops) or "naive" (explicit weights and
            shifted multiply-add convolutions: the float64 reference).
        weight_hook: None, or ``f(weights [B, heads, N, N]) -> weights`` (explicit weights are
            then formed, as for ``naive``; the convolutions keep the eager form unless ``naive``).
        """
        if impl not in ("eager", "naive"):
            raise ValueError(f"impl={impl!r}: a linear attention core runs 'eager' or 'naive'")
        naive = impl == "naive"
        p = num_prefix_tokens
        q2, k2, v2 = self.prepare(q, k, v, feat_size, p, naive)
        h = self.attn_heads()
        qh, kh, vh = (_heads(t, h) for t in (q2, k2, v2))
        if naive or weight_hook is not None:
            w = self.weights(qh, kh)
            if weight_hook is not None:
                w = weight_hook(w)
            out = w @ vh
        else:
            out = self.eager(qh, kh, vh)
        return self.finish(_tokens(out), v, feat_size, p, naive)


class HydraCore(LinearCore):
    """Hydra attention (Bolya et al. 2022): C heads of dim 1 and the cosine feature map over all C
    channels (``x / ||x||``, the paper's choice). No parameters of its own."""

    kind = "hydra"

    def attn_heads(self) -> int:
        return self.dim

    def prepare(self, q, k, v, feat_size, p, naive):
        return lf.l2_normalise(q), lf.l2_normalise(k), v

    def weights(self, q, k):
        return lf.hydra_weights(q, k)

    def eager(self, q, k, v):
        return lf.hydra_attention(q, k, v)


class EfficientCore(LinearCore):
    """Efficient attention (Shen et al. 2021): softmax over each query's features and over each
    key feature's tokens, per head (the authors' code applies no scale)."""

    kind = "efficient"

    def weights(self, q, k):
        return lf.efficient_weights(q, k)

    def eager(self, q, k, v):
        return lf.efficient_attention(q, k, v)


class AngularCore(LinearCore):
    """Linear-angular attention (Castling-ViT, You et al. 2023) with its auxiliary depthwise
    convolution on V. As in the authors' code: the output rows are L2-normalised per head, and the
    convolution (kernel ``(k, 1)``, default 9, one filter per head) runs along the token sequence
    (prefix tokens included) over each head's [N, d] value matrix."""

    kind = "angular"

    def __init__(self, dim: int, num_heads: int, conv_size: int = 9):
        super().__init__(dim, num_heads)
        self.dconv = nn.Conv2d(
            num_heads, num_heads, (conv_size, 1), padding=(conv_size // 2, 0), groups=num_heads, bias=False
        )

    def weights(self, q, k):
        return lf.angular_weights(q, k)

    def eager(self, q, k, v):
        return lf.angular_attention(q, k, v)

    def finish(self, out, v, feat_size, p, naive):
        h = self.num_heads
        out = lf.l2_normalise(_heads(out, h))
        return _tokens(out + _depthwise(_heads(v, h), self.dconv, naive))


class ReLUMultiScaleCore(LinearCore):
    """EfficientViT's lightweight multi-scale attention (Cai et al. 2023): ReLU linear attention
    over the h heads of q, k, v plus h more heads from q, k, v aggregated over each 5 x 5
    neighbourhood (a depthwise 5 x 5 then a 1 x 1 conv grouped per head and per q / k / v, no
    bias, as the authors' ``LiteMLA``). The 2C output channels are mapped back to C by ``merge``
    (EfficientViT's projection from 2C; the layer's own ``proj`` follows). Prefix tokens keep their
    own q, k, v in the aggregated heads."""

    kind = "relu_msa"

    def __init__(self, dim: int, num_heads: int, scale: int = 5):
        super().__init__(dim, num_heads)
        c3 = 3 * dim
        self.aggreg_dw = nn.Conv2d(c3, c3, scale, padding=scale // 2, groups=c3, bias=False)
        self.aggreg_pw = nn.Conv2d(c3, c3, 1, groups=3 * num_heads, bias=False)
        self.merge = nn.Linear(2 * dim, dim, bias=False)

    def attn_heads(self) -> int:
        return 2 * self.num_heads

    def prepare(self, q, k, v, feat_size, p, naive):
        qkv = torch.cat([q, k, v], dim=-1)  # [B, N, 3C]: q | k | v, heads as channel blocks of each
        img = _depthwise(_grid(qkv, feat_size, p), self.aggreg_dw, naive)
        if naive:
            img = lf.naive_grouped_pointwise(img, self.aggreg_pw.weight, self.aggreg_pw.groups)
        else:
            img = self.aggreg_pw(img)
        agg = _pad_prefix(_ungrid(img), qkv[:, :p])
        qa, ka, va = agg.chunk(3, dim=-1)
        return (torch.cat(pair, dim=-1) for pair in ((q, qa), (k, ka), (v, va)))  # [B, N, 2C] each

    def weights(self, q, k):
        return attention_weights(q, k, kind="linear", feature_map="relu")

    def eager(self, q, k, v):
        return linear_attention(q, k, v, feature_map="relu")

    def finish(self, out, v, feat_size, p, naive):
        return self.merge(out)


class FocusedCore(LinearCore):
    """Focused linear attention (FLatten, Han et al. 2023): the focused feature map (power 3) with
    a learnable per-channel scale ``softplus(s)`` (s starts at 0), linear attention per head, plus
    a depthwise 5 x 5 convolution of V on the grid shared by all heads (``head_dim`` filters)."""

    kind = "focused"

    def __init__(self, dim: int, num_heads: int, power: float = 3.0, conv_size: int = 5):
        super().__init__(dim, num_heads)
        self.power = power
        self.scale = nn.Parameter(torch.zeros(dim))
        hd = dim // num_heads
        self.dwc = nn.Conv2d(hd, hd, conv_size, padding=conv_size // 2, groups=hd)

    def prepare(self, q, k, v, feat_size, p, naive):
        s = F.softplus(self.scale)
        return lf.focused_features(q, s, self.power), lf.focused_features(k, s, self.power), v

    def weights(self, q, k):
        return attention_weights(q, k, kind="linear", feature_map="identity")

    def eager(self, q, k, v):
        return linear_attention(q, k, v, feature_map="identity")

    def finish(self, out, v, feat_size, p, naive):
        b, _, c = v.shape
        h, hd = self.num_heads, c // self.num_heads
        img = _grid(v, feat_size, p)  # [B, C, H, W]; heads as batch, head_dim as channels
        img = img.reshape(b * h, hd, *img.shape[2:])
        res = _ungrid(_depthwise(img, self.dwc, naive).reshape(b, c, *img.shape[2:]))
        return add_to_grid_tokens(out, res, p)


def _trunc_normal(*shape: int) -> nn.Parameter:
    """A parameter drawn from N(0, 0.02^2) truncated at +-2 (the authors' bias init)."""
    return nn.Parameter(trunc_normal_(torch.empty(*shape), std=0.02))


class AgentCore(LinearCore):
    """Agent attention (Han et al., ECCV 2024; LeapLabTHU/Agent-Attention): n agent tokens A pooled
    from the queries aggregate the values, ``V_A = softmax(A K^T / sqrt(d) + B1) V``, then broadcast
    them, ``O = softmax(Q A^T / sqrt(d) + B2) V_A``, plus a depthwise 3 x 3 convolution of V on the grid
    (``dim`` filters with bias). As the authors' code:

    - ``agent_num = 49`` agents, a 7 x 7 adaptive average pool of the grid queries (Agent-DeiT-T's
      default; Agent-PVT / Agent-Swin use 9, 16, 49, 49 by stage, which a core does not know);
    - the agent biases ``B1`` (agent -> key) and ``B2`` (query -> agent) are learnable 7 x 7 maps per
      head and agent, bilinearly resized to the grid; prefix tokens (a cls token) get one learnable
      bias per head and agent instead, and no convolution;
    - the biases start from N(0, 0.02) truncated.

    Left out: the authors' per-row / per-column bias terms sized to a fixed window
    (``ah/aw/ha/wa_bias``): the models here take any grid size.

    The core's attention step sees only per-head q and k, so ``prepare`` packs the agents and the
    biases into them (:meth:`_pack`): per head, q carries ``[q_i | B2_i]`` for the N tokens then
    ``[A_a | 0]`` for the n agents, k carries ``[k_j | B1_j]``; :meth:`_unpack` takes them apart.
    """

    kind = "agent"

    def __init__(self, dim: int, num_heads: int, agent_num: int = 49, conv_size: int = 3):
        super().__init__(dim, num_heads)
        pool = math.isqrt(agent_num)
        if pool * pool != agent_num:
            raise ValueError(f"agent_num must be a square (a pool_size x pool_size grid of agents), got {agent_num}")
        self.agent_num, self.pool_size = agent_num, pool
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.key_bias = _trunc_normal(num_heads, agent_num, 7, 7)  # the authors' an_bias
        self.query_bias = _trunc_normal(num_heads, agent_num, 7, 7)  # na_bias
        self.prefix_key_bias = _trunc_normal(num_heads, agent_num, 1)  # ac_bias
        self.prefix_query_bias = _trunc_normal(num_heads, 1, agent_num)  # ca_bias
        self.dwc = nn.Conv2d(dim, dim, conv_size, padding=conv_size // 2, groups=dim)

    def biases(self, feat_size: tuple[int, int], p: int) -> tuple[torch.Tensor, torch.Tensor]:
        """B1 [h, n, P + H*W] (agent -> key) and B2 [h, P + H*W, n] (query -> agent)."""
        h, n = self.num_heads, self.agent_num

        def grid_bias(b):  # [h, n, 7, 7] -> [h, n, H*W]
            return F.interpolate(b, size=feat_size, mode="bilinear", align_corners=False).reshape(h, n, -1)

        b1 = torch.cat([self.prefix_key_bias.expand(h, n, p), grid_bias(self.key_bias)], dim=-1)
        b2 = torch.cat([self.prefix_query_bias.expand(h, p, n), grid_bias(self.query_bias).transpose(1, 2)], dim=1)
        return b1, b2

    def prepare(self, q, k, v, feat_size, p, naive):
        h = self.num_heads
        img = _grid(q, feat_size, p)  # [B, C, H, W]: the agents pool the grid queries only
        size = (self.pool_size, self.pool_size)
        pooled = lf.naive_adaptive_avg_pool2d(img, size) if naive else F.adaptive_avg_pool2d(img, size)
        agents = _heads(_ungrid(pooled), h)  # [B, h, n, d]
        q_packed, k_packed = self._pack(_heads(q, h), agents, _heads(k, h), *self.biases(feat_size, p))
        return q_packed, k_packed, v

    def _pack(self, qh, ah, kh, b1, b2):
        """Per-head q [B, h, N, d], agents [B, h, n, d], k [B, h, N, d] and the biases -> packed q, k tokens."""
        b, h, n = qh.shape[0], self.num_heads, self.agent_num
        top = torch.cat([qh, b2.to(qh.dtype).expand(b, *b2.shape)], dim=-1)  # [B, h, N, d + n]
        bottom = torch.cat([ah, ah.new_zeros(b, h, n, n)], dim=-1)  # [B, h, n, d + n]
        k_packed = torch.cat([kh, b1.to(kh.dtype).transpose(1, 2).expand(b, h, -1, n)], dim=-1)  # [B, h, N, d + n]
        return _tokens(torch.cat([top, bottom], dim=2)), _tokens(k_packed)

    def _unpack(self, q, k):
        """Packed per-head q [B, h, N + n, d + n], k [B, h, N, d + n] -> q, k, agents, B1, B2."""
        d, n = self.head_dim, k.shape[2]
        return q[:, :, :n, :d], k[..., :d], q[:, :, n:, :d], k[..., d:].transpose(-2, -1), q[:, :, :n, d:]

    def weights(self, q, k):
        return lf.agent_weights(*self._unpack(q, k), self.scale)

    def eager(self, q, k, v):
        qh, kh, agents, b1, b2 = self._unpack(q, k)
        return lf.agent_attention(qh, kh, v, agents, b1, b2, self.scale)

    def finish(self, out, v, feat_size, p, naive):
        return add_to_grid_tokens(out, _ungrid(_depthwise(_grid(v, feat_size, p), self.dwc, naive)), p)


class PolarityCore(FocusedCore):
    """PolaFormer's polarity-aware linear attention (Meng et al., ICLR 2025; ZacharyMeng/PolaFormer).

    With ``s = softplus(scale)`` per channel (as FLatten) and per head the learnable power
    ``p = 1 + alpha * sigmoid(power)`` per channel (alpha = 4, ``power`` starts at 0, so p = 3), q and k
    split by sign: ``q+ = relu(q / s) ** p``, ``q- = relu(-q / s) ** p`` (and k). The same-sign
    features ``[q+ | q-] . [k+ | k-]`` attend with the first half of each head's values, the
    opposite-sign ``[q- | q+] . [k+ | k-]`` with the second half; each term normalised as the
    authors' code: ``q (K^T V / N) / (q . mean_j k_j + 1e-6)``. Then, as FLatten (whose scale and
    convolution this core inherits), a depthwise 5 x 5 convolution of V shared by the heads, and the
    authors' output gate ``g``, a linear map of the layer input: here of V (``gate``), which is the
    same family of maps whenever V's projection is invertible.

    Each head is two attention heads for the explicit weights: ``2 * num_heads`` rows of head_dim / 2
    values (so head_dim must be even). Left out: the learned positional encoding added to K, which
    needs a fixed token count (as for FLatten).
    """

    kind = "polarity"

    def __init__(self, dim: int, num_heads: int, alpha: float = 4.0, conv_size: int = 5):
        super().__init__(dim, num_heads, conv_size=conv_size)
        hd = dim // num_heads
        if hd % 2:
            raise ValueError(f"polarity attention splits each head's values in two: head_dim={hd} must be even")
        self.alpha = alpha
        self.power = nn.Parameter(torch.zeros(num_heads, hd))  # p = 1 + alpha * sigmoid(power)
        self.gate = nn.Linear(dim, dim)

    def attn_heads(self) -> int:
        return 2 * self.num_heads

    def prepare(self, q, k, v, feat_size, p, naive):
        s = F.softplus(self.scale)
        h = self.num_heads
        power = (1 + self.alpha * torch.sigmoid(self.power))[:, None, :]  # [h, 1, d]
        q_pos, q_neg = lf.polarity_features(_heads(q / s, h), power)  # [B, h, N, d] each
        k_pos, k_neg = lf.polarity_features(_heads(k / s, h), power)
        k_feat = torch.cat([k_pos, k_neg], dim=-1)  # [B, h, N, 2d]
        q_same = torch.cat([q_pos, q_neg], dim=-1)
        q_opp = torch.cat([q_neg, q_pos], dim=-1)
        q_same = lf.mean_normalised_queries(q_same, q_same, k_feat)
        q_opp = lf.mean_normalised_queries(q_opp, q_opp, k_feat)
        b, _, n, d2 = k_feat.shape
        q2 = torch.stack([q_same, q_opp], dim=2).reshape(b, 2 * h, n, d2)  # head 2i: same sign, 2i + 1: opposite
        k2 = torch.stack([k_feat, k_feat], dim=2).reshape(b, 2 * h, n, d2).to(q2.dtype)  # autocast: one dtype
        return _tokens(q2), _tokens(k2), v  # v's 2h heads are the halves of its h heads

    def weights(self, q, k):
        return lf.dot_weights(q, k)

    def eager(self, q, k, v):
        return lf.dot_attention(q, k, v)

    def finish(self, out, v, feat_size, p, naive):
        return super().finish(out, v, feat_size, p, naive) * self.gate(v)


class MLLACore(LinearCore):
    """The linear attention of MLLA's block (Han et al., NeurIPS 2024, "Demystify Mamba in Vision";
    LeapLabTHU/MLLA), as it replaces an attention layer.

    ``phi(x) = elu(x) + 1`` on q and k; 2-D RoPE (:func:`~inline_attn.ops.linear_family.rope_2d`,
    over all C channels) on ``phi(q)`` and ``phi(k)`` in the numerator only; per head
    ``O_i = rope(phi(q_i)) (rope(phi(K))^T V / N) / (phi(q_i) . mean_j phi(k_j) + 1e-6)`` as the
    authors' code; plus LePE, a depthwise 3 x 3 convolution of V with bias; the sum gated by
    ``silu(gate(V))``, MLLA's ``act_res`` branch (a linear map of the block's input: here of V, the
    same family of maps whenever V's projection is invertible). The layer's own ``proj`` is MLLA's
    ``out_proj``.

    Left out (the macro-architecture; docs/reproduction.md): the input projection with its depthwise
    3 x 3 convolution and SiLU before the attention (MLLA's attention takes that branch as V and
    projects only q and k), the convolutional position encodings around the block (``cpe1``,
    ``cpe2``), the convolutional stem and patch merging, and MLLA's own stage layout.
    """

    kind = "mlla"

    def __init__(self, dim: int, num_heads: int, conv_size: int = 3):
        super().__init__(dim, num_heads)
        self.lepe = nn.Conv2d(dim, dim, conv_size, padding=conv_size // 2, groups=dim)
        self.gate = nn.Linear(dim, dim)

    def prepare(self, q, k, v, feat_size, p, naive):
        h = self.num_heads
        q_feat, k_feat = F.elu(q) + 1.0, F.elu(k) + 1.0
        q_rope = _heads(lf.rope_2d(q_feat, feat_size, p), h)
        q2 = lf.mean_normalised_queries(q_rope, _heads(q_feat, h), _heads(k_feat, h))
        return _tokens(q2), lf.rope_2d(k_feat, feat_size, p), v

    def weights(self, q, k):
        return lf.dot_weights(q, k)

    def eager(self, q, k, v):
        return lf.dot_attention(q, k, v)

    def finish(self, out, v, feat_size, p, naive):
        out = add_to_grid_tokens(out, _ungrid(_depthwise(_grid(v, feat_size, p), self.lepe, naive)), p)
        return out * F.silu(self.gate(v))


LINEAR_CORES: dict[str, type[LinearCore]] = {
    cls.kind: cls
    for cls in (
        HydraCore,
        EfficientCore,
        AngularCore,
        ReLUMultiScaleCore,
        FocusedCore,
        AgentCore,
        PolarityCore,
        MLLACore,
    )
}


def make_core(kind: str, dim: int, num_heads: int) -> LinearCore:
    """A core by name (one of :data:`LINEAR_CORES`)."""
    if kind not in LINEAR_CORES:
        raise ValueError(f"unknown linear attention {kind!r}: expected one of {tuple(LINEAR_CORES)}")
    return LINEAR_CORES[kind](dim, num_heads)
