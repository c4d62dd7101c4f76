"""Token attention layers: InLine, linear, softmax and the other linear attentions with one signature.

``x: [B, N, C]`` with ``N = num_prefix_tokens + H*W`` and ``feat_size = (H, W)``. The three
layers share projections and state-dict names (``qkv``, ``proj``, ``residual.0``, ``residual.2``)
so an ablation is one argument: ``build_attention("softmax", dim, heads)``. The other linear
attentions (:data:`ATTENTION_CHOICES`: hydra, efficient, angular, relu_msa, focused, agent, polarity,
mlla) share them too and add their own modules under ``core``.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from ..ops import ATTENTION_KINDS, FEATURE_MAPS, check_count, check_feat_size
from .common import check_flag, check_heads
from .feature_maps import AffineReLUFeatureMap
from .linear_family import LINEAR_CORES, make_core
from .local_residual import LocalResidual, uses_local_residual
from .record import RecordableAttention

FEATURE_MAP_CHOICES = tuple(FEATURE_MAPS) + ("affine_relu",)
ATTENTION_CHOICES = tuple(ATTENTION_KINDS) + tuple(LINEAR_CORES)


def check_kind(kind: str, feature_map: Optional[str] = None) -> str:
    """Validate an attention kind (one of :data:`ATTENTION_CHOICES`) and that it takes ``feature_map``."""
    if kind not in ATTENTION_CHOICES:
        raise ValueError(f"unknown attention kind {kind!r}: expected one of {ATTENTION_CHOICES}")
    if kind not in ("inline", "linear") and feature_map not in (None, "identity"):
        raise ValueError(
            f"{kind} attention has its own feature map: it takes no feature_map, got feature_map={feature_map!r}"
        )
    return kind


def make_feature_map(feature_map: Optional[str], head_dim: int):
    """A feature map name -> the value the ops take (a name, or a learnable module)."""
    if feature_map is None or feature_map in FEATURE_MAPS:
        return feature_map
    if feature_map == "affine_relu":
        return AffineReLUFeatureMap(head_dim)
    raise ValueError(f"unknown feature map {feature_map!r}: expected one of {FEATURE_MAP_CHOICES}")


class TokenAttention(RecordableAttention):
    """Multi-head attention of one kind over ``[B, N, C]`` tokens (prefix tokens + an H x W grid).

    Args:
        dim: channels C.
        num_heads: heads h (C % h == 0).
        kind: "inline", "linear", "softmax", or another linear attention: "hydra" (Bolya et al.
            2022), "efficient" (Shen et al. 2021), "angular" (Castling-ViT), "relu_msa"
            (EfficientViT), "focused" (FLatten), "agent" (Agent attention), "polarity" (PolaFormer),
            "mlla" (MLLA's linear attention); see :mod:`inline_attn.layers.linear_family`.
        qkv_bias: bias of the fused qkv projection.
        feature_map: phi for inline (default identity) and linear (default relu) attention; one of
            identity, relu, leakyrelu, exp, affine_relu (learnable, paper Table 1).
        local_residual: add the predicted 3x3 local residual on V (default: on for InLine only).
        num_prefix_tokens: tokens before the grid (1 for a cls token); they get no residual but
            count in N and in the residual's context mean (as in the reference).
        attn_drop: dropout on softmax weights (InLine/linear never form weights; the
            reference ignores it there too).
        proj_drop: dropout after the output projection.
        split_qkv: separate ``q`` and ``kv`` projections (PVT's state-dict layout) instead of
            the fused ``qkv``; the same computation.
        impl: this layer's implementation, one of :data:`inline_attn.ops.IMPLS` (None = the
            process default, :func:`inline_attn.ops.use_impl`); see :class:`RecordableAttention`.

    A flag (``qkv_bias``, ``local_residual``, ``split_qkv``) that is not a bool (``"no"``) is a
    ValueError, as is an ``x`` that is not a tensor.

    A one-kind subclass (:class:`InLineAttention`, :class:`SoftmaxAttention`, ...) declares its
    kind in the class attribute ``kind``; ``kind=`` may repeat it, a different one is a ValueError.
    """

    kind: Optional[str] = None  # a one-kind subclass's kind (here: any, chosen by ``kind=``)

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        kind: Optional[str] = None,
        qkv_bias: bool = True,
        feature_map: Optional[str] = None,
        local_residual: Optional[bool] = None,
        num_prefix_tokens: int = 0,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        split_qkv: bool = False,
        impl: Optional[str] = None,
    ):
        kind = self._layer_kind(kind)
        super().__init__(impl)
        check_kind(kind, feature_map)
        qkv_bias, split_qkv = check_flag("qkv_bias", qkv_bias), check_flag("split_qkv", split_qkv)
        head_dim = check_heads(dim, num_heads)
        num_prefix_tokens = check_count("num_prefix_tokens", num_prefix_tokens)
        self.kind = kind
        self.dim, self.num_heads, self.head_dim = dim, num_heads, head_dim
        self.num_prefix_tokens = num_prefix_tokens
        self.scale = head_dim**-0.5
        self.feature_map = make_feature_map(feature_map, head_dim)
        self.core = make_core(kind, dim, num_heads) if kind in LINEAR_CORES else None
        self.split_qkv = split_qkv
        if split_qkv:
            self.q = nn.Linear(dim, dim, bias=qkv_bias)
            self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        else:
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.residual = LocalResidual(dim, num_heads) if uses_local_residual(kind, local_residual) else None

    @classmethod
    def _layer_kind(cls, kind: Optional[str]) -> str:
        """``kind=`` (None: "inline"), or a one-kind subclass's own kind, which ``kind=`` may only repeat."""
        if cls.kind is None:
            return "inline" if kind is None else kind
        if kind is not None and kind != cls.kind:
            raise ValueError(f"{cls.__name__} is {cls.kind!r} attention; got kind={kind!r}")
        return cls.kind

    def forward(
        self,
        x: torch.Tensor,
        feat_size: tuple[int, int],
        *,
        bias: Optional[torch.Tensor] = None,
        mask: Optional[torch.Tensor] = None,
        token_coords=None,
    ) -> torch.Tensor:
        """x: [B, N, C], feat_size (H, W) -> [B, N, C].

        The residual weights are predicted from the mean of x over all N tokens (prefix tokens
        included, as the reference). bias / mask: softmax only ([heads or 1, N, N] broadcastable;
        a ``ValueError`` for InLine and linear attention).
        token_coords: passed to attention hooks (a tensor, or a zero-argument callable evaluated
            only while a hook is installed; see :class:`AttentionRecord`).
        """
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"x must be a torch.Tensor [B, N, {self.dim}], got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be [B, N, {self.dim}], got shape {tuple(x.shape)}")
        p = self.num_prefix_tokens
        h, w = check_feat_size(feat_size, x.shape[1], p)
        q, k, v = self._project(x)  # [B, N, C] views of the projection outputs
        attend = dict(
            feat_size=(h, w),
            num_prefix_tokens=p,
            feature_map=self.feature_map,
            scale=self.scale,
            bias=bias,
            mask=mask,
            token_coords=token_coords,
            attn_drop=self.attn_drop,
        )
        if self.residual is None:
            out = self.attend_tokens(q, k, v, **attend)
        else:  # weights predicted from x's token mean, inside the fused layer core where it runs
            out = self.attend_predicted(x, q, k, v, residual=self.residual, **attend)
        return self.proj_drop(self.proj(out))

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [B, N, C] -> q, k, v: [B, N, C] views of the projection outputs."""
        if self.split_qkv:
            k, v = self.kv(x).chunk(2, dim=-1)
            return self.q(x), k, v
        return self.qkv(x).chunk(3, dim=-1)

    def extra_repr(self) -> str:
        return f"kind={self.kind}, dim={self.dim}, num_heads={self.num_heads}, prefix={self.num_prefix_tokens}"


class InLineAttention(TokenAttention):
    """InLine attention layer (injective linear attention + local residual); see TokenAttention."""

    kind = "inline"


class LinearAttention(TokenAttention):
    """Vanilla linear attention layer (ReLU kernel by default); see TokenAttention."""

    kind = "linear"


class SoftmaxAttention(TokenAttention):
    """Softmax attention layer (SDPA); see TokenAttention."""

    kind = "softmax"


class HydraAttention(TokenAttention):
    """Hydra attention (Bolya et al. 2022); see :class:`~inline_attn.layers.linear_family.HydraCore`."""

    kind = "hydra"


class EfficientAttention(TokenAttention):
    """Efficient attention (Shen et al. 2021); see :class:`~inline_attn.layers.linear_family.EfficientCore`."""

    kind = "efficient"


class LinearAngularAttention(TokenAttention):
    """Linear-angular attention (Castling-ViT); see :class:`~inline_attn.layers.linear_family.AngularCore`."""

    kind = "angular"


class ReLUMultiScaleAttention(TokenAttention):
    """EfficientViT's ReLU multi-scale linear attention; see
    :class:`~inline_attn.layers.linear_family.ReLUMultiScaleCore`."""

    kind = "relu_msa"


class FocusedLinearAttention(TokenAttention):
    """Focused linear attention (FLatten); see :class:`~inline_attn.layers.linear_family.FocusedCore`."""

    kind = "focused"


class AgentAttention(TokenAttention):
    """Agent attention (Han et al., ECCV 2024); see :class:`~inline_attn.layers.linear_family.AgentCore`."""

    kind = "agent"


class PolarityAttention(TokenAttention):
    """PolaFormer's polarity-aware linear attention (Meng et al., ICLR 2025); see
    :class:`~inline_attn.layers.linear_family.PolarityCore`."""

    kind = "polarity"


class MLLAAttention(TokenAttention):
    """MLLA's linear attention (Han et al., NeurIPS 2024); see :class:`~inline_attn.layers.linear_family.MLLACore`."""

    kind = "mlla"


def build_attention(kind: str, dim: int, num_heads: int, **kwargs) -> TokenAttention:
    """Factory: ``build_attention(kind, dim, num_heads, **kwargs)``, kind one of :data:`ATTENTION_CHOICES`."""
    return TokenAttention(dim, num_heads, kind=kind, **kwargs)
