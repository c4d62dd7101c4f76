"""InLine-PVT: the Pyramid Vision Transformer with InLine attention (paper Sec. 5.1).

Four stages at strides 4, 8, 16, 32: a patch embedding (Conv2d 4x4 then 2x2, each followed by
a LayerNorm), one learned position embedding per stage, then blocks. InLine (and linear) blocks
project ``q`` and ``kv`` separately and attend over all tokens (no spatial reduction); softmax
blocks keep PVT's spatial-reduction attention (keys/values from a stride-``sr`` conv + LayerNorm,
sr 8-4-2-1). No cls token, no final norm; the head reads the token mean.

State-dict names follow the reference (``patch_embed{i}``, ``pos_embed{i}``, ``block{i}.{j}``,
``head``). Differences from the reference, none of which changes the output at the built size:
position embeddings are resized whenever the stage grid differs from the built one (the
reference compares every stage with stage 1's token count), stage inputs the patch does not
divide are zero-padded, and ``forward_features`` returns the last stage as an NCHW map.
"""

from __future__ import annotations

from functools import partial
from typing import Optional, Sequence, Union

import torch
import torch.nn as nn

from ..layers import (
    trunc_normal_,
    drop_path_rates,
    BlockOptions,
    PatchEmbed,
    PreNormBlock,
    RecordableAttention,
    TokenAttention,
    check_heads,
    init_weights_,
    resize_pos_embed,
    to_2tuple,
    tokens_to_nchw,
)
from ._base import InLineModel
from ._helpers import parse_pattern
from .registry import Family

__all__ = [
    "InLinePVT",
    "PVTAttention",
    "PVTBlock",
    "SpatialReductionAttention",
    "checkpoint_filter_fn",
]


class PVTAttention(TokenAttention):
    """InLine (or linear / full softmax) attention with PVT's separate ``q`` / ``kv`` projections.

    InLine output per head (paper Eq. 5, the reference's scale):
    ``O_i = sum_j w_ij V_j`` with ``w_ij = (1 + d^-0.5 phi(Q_i).(phi(K_j) - k_bar)) / N``, plus the
    predicted 3x3 local residual on V (paper Sec. 4.2; context = mean token of the input).

    x: [B, H*W, C], feat_size (H, W) -> [B, H*W, C].
    """

    def __init__(self, dim: int, num_heads: int, **kwargs):
        super().__init__(dim, num_heads, split_qkv=True, **kwargs)


class SpatialReductionAttention(RecordableAttention):
    """PVT's softmax attention: keys and values from an ``sr x sr`` stride-``sr`` conv of the map
    followed by a LayerNorm (sr = 1: plain multi-head softmax attention).

    x: [B, H*W, C], feat_size (H, W) -> [B, H*W, C]; the attention is [N, (H/sr)(W/sr)].
    """

    kind = "softmax"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        sr_ratio: int = 1,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        impl: Optional[str] = None,
    ):
        super().__init__(impl)
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = check_heads(dim, num_heads)
        self.scale = self.head_dim**-0.5
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        if sr_ratio < 1:
            raise ValueError(f"sr_ratio must be >= 1, got {sr_ratio}")
        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim)  # the reference's default eps (1e-5), not the blocks' 1e-6

    def forward(self, x: torch.Tensor, feat_size: tuple[int, int]) -> torch.Tensor:
        b, n, c = x.shape
        h, w = feat_size
        if n != h * w:
            raise ValueError(f"token count {n} does not match feat_size {h}x{w}")
        q = self.q(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        src = x
        if self.sr_ratio > 1:
            if min(h, w) < self.sr_ratio:
                raise ValueError(
                    f"feature map {h}x{w} is smaller than the spatial reduction {self.sr_ratio}: use a larger input"
                )
            src = self.norm(self.sr(tokens_to_nchw(x, (h, w))).flatten(2).transpose(1, 2))
        kv = self.kv(src).view(b, src.shape[1], 2, self.num_heads, self.head_dim)
        k, v = (t.transpose(1, 2) for t in kv.unbind(2))
        out = self.attend(q, k, v, feat_size=(h, w), kind="softmax", scale=self.scale, attn_drop=self.attn_drop)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, sr_ratio={self.sr_ratio}"


class PVTBlock(PreNormBlock):
    """Pre-norm block over ``[B, H*W, C]``: InLine / linear attention without spatial reduction,
    or PVT's softmax attention with spatial reduction ``sr_ratio``."""

    def __init__(self, dim: int, num_heads: int, *, kind: str = "inline", sr_ratio: int = 1, **options):
        """options: :class:`~inline_attn.layers.BlockOptions` (mlp_ratio, qkv_bias, feature_map, ...)."""
        o = BlockOptions(**options)
        if kind == "softmax":
            if o.local_residual:
                raise ValueError("PVT softmax blocks (spatial reduction) take no local residual")
            attn = SpatialReductionAttention(dim, num_heads, sr_ratio=sr_ratio, **o.softmax())
        else:
            attn = PVTAttention(dim, num_heads, kind=kind, **o.attention())
        super().__init__(dim, attn, **o.mlp())


def _check_per_stage(num_stages: int, **per_stage) -> None:
    """ValueError naming the first per-stage argument whose length is not ``num_stages``."""
    for arg, val in per_stage.items():
        if len(val) != num_stages:
            raise ValueError(f"{arg}={tuple(val)} must have one entry per stage ({num_stages} stages)")


class InLinePVT(InLineModel):
    """PVT (v1) with InLine, softmax (spatial reduction) or linear attention per stage.

    Args:
        img_size: built input size (int or (H, W)); other sizes work (position embeddings are
            resized bilinearly per stage).
        patch_size: stride of the first patch embedding (later stages use 2).
        in_chans, num_classes: input channels, classes (0 = no head).
        embed_dims, num_heads, mlp_ratios, depths: per stage.
        sr_ratios: spatial reduction of the softmax stages (InLine / linear stages use none).
        qkv_bias: bias of the q / kv projections.
        drop_rate, attn_drop_rate, drop_path_rate: dropouts; stochastic depth rises linearly.
        pattern: one letter per stage, I / S / L (M<n> suffix: first n blocks of M stages InLine).
        norm_eps: eps of the blocks' LayerNorms (1e-6 in every published model; the reference
            class's own default is PyTorch's 1e-5). Patch-embedding and spatial-reduction norms
            always use 1e-5, as in the reference.
        feature_map, local_residual: InLine / linear options (None = the kind's default).
        global_pool: "avg" only (PVT has no cls token).
        impl: every attention layer's implementation, one of :data:`inline_attn.ops.IMPLS`
            (None = the process default, :func:`inline_attn.ops.use_impl`).

    The levels of :meth:`forward_intermediates` are the stages (strides 4, 8, 16, 32).
    """

    no_weight_decay_patterns = ("pos_embed*",)

    def __init__(
        self,
        img_size: Union[int, tuple[int, int]] = 224,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dims: Sequence[int] = (64, 128, 320, 512),
        num_heads: Sequence[int] = (2, 4, 10, 16),
        mlp_ratios: Sequence[float] = (8, 8, 4, 4),
        depths: Sequence[int] = (2, 2, 2, 2),
        sr_ratios: Sequence[int] = (8, 4, 2, 1),
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        pattern: str = "IIII",
        feature_map: Optional[str] = None,
        local_residual: Optional[bool] = None,
        global_pool: str = "avg",
        impl: Optional[str] = None,
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        num_stages = len(depths)
        _check_per_stage(
            num_stages, embed_dims=embed_dims, num_heads=num_heads, mlp_ratios=mlp_ratios, sr_ratios=sr_ratios
        )
        kinds = parse_pattern(pattern, depths)
        norm_layer = partial(nn.LayerNorm, eps=norm_eps)
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.depths = tuple(depths)
        self.embed_dims = tuple(embed_dims)
        self.num_features = embed_dims[-1]
        self.num_prefix_tokens = 0
        self.pattern = pattern

        total = sum(depths)
        dpr = drop_path_rates(drop_path_rate, total)
        attention = dict(qkv_bias=qkv_bias, feature_map=feature_map, attn_drop=attn_drop_rate)
        feature_info, cur, stride = [], 0, 1
        grid = to_2tuple(img_size)  # each stage embeds the previous stage's grid (stage 1: the image)
        for i in range(num_stages):
            p = patch_size if i == 0 else 2
            in_dim = in_chans if i == 0 else embed_dims[i - 1]  # the patch norm keeps the default eps (reference)
            embed = PatchEmbed(grid, p, in_dim, embed_dims[i], norm_layer=nn.LayerNorm, is_stem=i == 0)
            grid = embed.grid_size
            stride *= p
            setattr(self, f"patch_embed{i + 1}", embed)
            setattr(self, f"pos_embed{i + 1}", nn.Parameter(torch.zeros(1, embed.num_patches, embed_dims[i])))
            setattr(self, f"pos_drop{i + 1}", nn.Dropout(drop_rate))
            blocks = [
                PVTBlock(
                    embed_dims[i],
                    num_heads[i],
                    kind=kind,
                    sr_ratio=sr_ratios[i],
                    mlp_ratio=mlp_ratios[i],
                    drop=drop_rate,
                    drop_path=dpr[cur + j],
                    norm_layer=norm_layer,
                    local_residual=None if kind == "softmax" else local_residual,  # SR attention has none
                    **attention,
                )
                for j, kind in enumerate(kinds[i])
            ]
            setattr(self, f"block{i + 1}", nn.ModuleList(blocks))
            cur += depths[i]
            feature_info.append(dict(num_chs=embed_dims[i], reduction=stride, module=f"block{i + 1}"))
        self.norm = nn.Identity()  # PVT has no final norm (the reference pools the last stage directly)
        self.head = nn.Linear(embed_dims[-1], num_classes) if num_classes > 0 else nn.Identity()
        self.init_contract(feature_info)
        self.set_impl(impl)
        self._init_weights()

    def _init_weights(self) -> None:
        # as the reference: trunc-normal 0.02 for the position embeddings, then the shared
        # linear / LayerNorm init (convs keep PyTorch's default)
        for i in range(self._num_levels):
            trunc_normal_(getattr(self, f"pos_embed{i + 1}"), std=0.02)
        init_weights_(self)

    def forward(self, x: torch.Tensor):
        """images [B, C_in, H, W] -> logits [B, num_classes] (a features_only model: its maps)."""
        return self._forward(x)  # a frame of this class's own for torch.compile (see InLineModel)

    # ---- the contract's hooks (state: the stage input / output as an NCHW map)

    def _stem(self, x: torch.Tensor) -> torch.Tensor:
        return x  # stage 1's patch embedding is the stem

    def _run_level(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Stage i (0-based): x [B, C_prev, H, W] -> [B, C_i, H / s, W / s]."""
        embed: PatchEmbed = getattr(self, f"patch_embed{i + 1}")
        x, feat_size = embed(x)
        pos = resize_pos_embed(getattr(self, f"pos_embed{i + 1}"), embed.grid_size, feat_size)
        x = getattr(self, f"pos_drop{i + 1}")(x + pos)
        for blk in getattr(self, f"block{i + 1}"):
            x = self.checkpointed(blk, x, feat_size)
        return tokens_to_nchw(x, feat_size)

    def _level_map(self, i: int, x: torch.Tensor, norm: bool) -> torch.Tensor:
        return x  # no final norm to apply

    def _final(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """-> the last stage's map [B, C_4, H/32, W/32]."""
        return x

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))  # the token mean, no final norm, as the reference

    def _level_modules(self, i: int) -> list[str]:
        return [f"block{i + 1}", f"pos_drop{i + 1}", f"pos_embed{i + 1}", f"patch_embed{i + 1}"]

    def _stem_modules(self) -> list[str]:
        return ["patch_embed1", "pos_embed1"]


def checkpoint_filter_fn(state_dict: dict, model: InLinePVT) -> dict:
    """Map a reference PVT state dict onto ``model`` (used by load_checkpoint).

    The names agree already; per-stage position embeddings of another (square) grid are
    resized to the model's.
    """
    out = dict(state_dict)
    for i in range(model.num_levels):
        key = f"pos_embed{i + 1}"
        pos, mine = out.get(key), getattr(model, key)
        resizable = isinstance(pos, torch.Tensor) and pos.dim() == 3 and pos.shape[2] == mine.shape[2]
        if resizable and pos.shape != mine.shape:
            side = int(round(pos.shape[1] ** 0.5))
            if side * side == pos.shape[1]:
                out[key] = resize_pos_embed(pos, (side, side), getattr(model, f"patch_embed{i + 1}").grid_size)
    return out


InLinePVT.checkpoint_filter_fn = staticmethod(checkpoint_filter_fn)

# ---- registered variants (heads and MLP ratios as the reference code builds them)

_REFERENCE = "LeapLabTHU/InLine models/inline_pvt.py:PyramidVisionTransformer"
_TINY = dict(
    img_size=224,
    patch_size=4,
    embed_dims=(64, 128, 320, 512),
    num_heads=(2, 4, 10, 16),
    mlp_ratios=(8, 8, 4, 4),
    sr_ratios=(8, 4, 2, 1),
    qkv_bias=True,
    depths=(2, 2, 2, 2),
    pattern="IIII",
    drop_path_rate=0.1,
)
_SMALL = dict(_TINY, depths=(3, 4, 6, 3))
_MEDIUM = dict(_TINY, depths=(3, 4, 18, 3), drop_path_rate=0.3)
_LARGE = dict(_TINY, depths=(3, 8, 27, 3), drop_path_rate=0.3)

# evaluated with the Swin codebase's pipeline (crop 0.875, ImageNet mean/std); the reference's
# timm _cfg metadata says crop 0.9 and mean/std 0.5, not what the authors ran
_FAMILY = Family(InLinePVT, "pvt", reference=_REFERENCE, first_conv="patch_embed1.proj")
# size, title, defaults, then the paper's top-1 (%), parameters and GMACs
inline_pvt_tiny = _FAMILY.variant("tiny", "InLine-PVT-T", _TINY, 78.2, 12_032_232, 1.98)
inline_pvt_small = _FAMILY.variant("small", "InLine-PVT-S", _SMALL, 82.0, 21_556_136, 3.91)
inline_pvt_medium = _FAMILY.variant("medium", "InLine-PVT-M", _MEDIUM, 83.2, 37_618_856, 6.86)
inline_pvt_large = _FAMILY.variant("large", "InLine-PVT-L", _LARGE, 83.6, 51_154_280, 10.13)
