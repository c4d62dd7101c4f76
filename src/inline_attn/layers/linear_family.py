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

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import attention_weights, linear_attention
from ..ops import linear_family as lf
from ..ops.tokens import add_to_grid_tokens


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

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "fast" in cls.__dict__:  # the linear-time step was called fast() before the eager / naive vocabulary
            raise TypeError(f"{cls.__name__}.fast(q, k, v) is now named eager(q, k, v)")

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
    """Hydra attention (Bolya et al. 2022): C heads of dim 1 and the cosine kernel over all C
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
        return attention_weights(q, k, kind="linear", kernel="relu")

    def eager(self, q, k, v):
        return linear_attention(q, k, v, kernel="relu")

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
        return attention_weights(q, k, kind="linear", kernel="identity")

    def eager(self, q, k, v):
        return linear_attention(q, k, v, kernel="identity")

    def finish(self, out, v, feat_size, p, naive):
        b, _, c = v.shape
        h, hd = self.num_heads, c // self.num_heads
        img = _grid(v, feat_size, p)  # [B, C, H, W]; heads as batch, head_dim as channels
        img = img.reshape(b * h, hd, *img.shape[2:])
        res = _ungrid(_depthwise(img, self.dwc, naive).reshape(b, c, *img.shape[2:]))
        return add_to_grid_tokens(out, res, p)


LINEAR_CORES: dict[str, type[LinearCore]] = {
    cls.kind: cls for cls in (HydraCore, EfficientCore, AngularCore, ReLUMultiScaleCore, FocusedCore)
}


def make_core(kind: str, dim: int, num_heads: int) -> LinearCore:
    """A core by name (one of :data:`LINEAR_CORES`)."""
    if kind not in LINEAR_CORES:
        raise ValueError(f"unknown linear attention {kind!r}: expected one of {tuple(LINEAR_CORES)}")
    return LINEAR_CORES[kind](dim, num_heads)
