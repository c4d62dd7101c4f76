"""InLine-DeiT: a DeiT/ViT with InLine attention in every block (paper Sec. 5.1).

Layout and state-dict names follow the reference (``patch_embed.proj``, ``cls_token``,
``pos_embed``, ``blocks.<i>.{norm1,attn,norm2,mlp}``, ``norm``, ``head``), so the authors'
checkpoints load unchanged. Beyond the reference: any input size (the position embedding is
resized bilinearly when the patch grid differs from the built one), softmax / linear ablations
(``pattern``), multi-scale features and gradient checkpointing.
"""

from __future__ import annotations

from functools import partial
from typing import Optional, Union

import torch
import torch.nn as nn

from ..layers import (
    trunc_normal_,
    drop_path_rates,
    BlockOptions,
    PatchEmbed,
    PreNormBlock,
    TokenAttention,
    init_weights_,
    resize_pos_embed,
    tokens_to_nchw,
)
from ._base import InLineModel
from ._helpers import parse_pattern
from .registry import Family

__all__ = ["DeiTBlock", "InLineDeiT", "checkpoint_filter_fn"]


class DeiTBlock(PreNormBlock):
    """Pre-norm transformer block over ``[B, P + H*W, C]`` with P prefix tokens (the cls token).

    The residual context is the mean over all tokens (cls included) of norm1(x), TokenAttention's
    default, as in the reference.
    """

    def __init__(self, dim: int, num_heads: int, *, kind: str = "inline", num_prefix_tokens: int = 1, **options):
        """options: :class:`~inline_attn.layers.BlockOptions` (mlp_ratio, qkv_bias, feature_map, ...)."""
        o = BlockOptions(**options)
        attn = TokenAttention(dim, num_heads, kind=kind, num_prefix_tokens=num_prefix_tokens, **o.attention())
        super().__init__(dim, attn, **o.mlp())


class InLineDeiT(InLineModel):
    """ViT / DeiT with a cls token whose attention is InLine, softmax or linear.

    Args:
        img_size: built input size (int or (H, W)); other sizes work, the position embedding
            is resized bilinearly to the actual patch grid.
        patch_size: patch side (stride of the stem).
        in_chans, num_classes: input channels, classes (0 = no head).
        embed_dim, depth, num_heads, mlp_ratio, qkv_bias: the usual ViT sizes.
        drop_rate: dropout after the position embedding, in the MLPs and after attention.
        attn_drop_rate: softmax attention dropout.
        drop_path_rate: stochastic depth, linearly increasing over the blocks.
        pattern: "I" (InLine, the paper's model), "S" (softmax: plain DeiT) or "L" (linear).
        feature_map: phi of InLine/linear attention (None = the kind's default).
        local_residual: the 3x3 local residual (None = on for InLine only).
        global_pool: "token" (the cls token, as the reference) or "avg" (mean of patch tokens).
        impl: every attention layer's implementation, one of :data:`inline_attn.ops.IMPLS`
            (None = the process default, :func:`inline_attn.ops.use_impl`).

    The levels of :meth:`forward_intermediates` are the blocks (all at stride ``patch_size``).
    """

    global_pools = ("token", "avg")
    no_weight_decay_patterns = ("pos_embed", "cls_token")
    single_scale = True

    def __init__(
        self,
        img_size: Union[int, tuple[int, int]] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 192,
        depth: int = 12,
        num_heads: int = 6,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        pattern: str = "I",
        feature_map: Optional[str] = None,
        local_residual: Optional[bool] = None,
        global_pool: str = "token",
        impl: Optional[str] = None,
    ):
        super().__init__()
        if depth <= 0:
            raise ValueError(f"depth must be positive, got {depth}")
        kinds = parse_pattern(pattern, [depth])[0]
        norm_layer = partial(nn.LayerNorm, eps=1e-6)
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.embed_dim = embed_dim
        self.num_prefix_tokens = 1
        self.pattern = pattern

        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + 1, embed_dim))
        self.pos_drop = nn.Dropout(drop_rate)
        dpr = drop_path_rates(drop_path_rate, depth)
        attention = dict(
            qkv_bias=qkv_bias, feature_map=feature_map, local_residual=local_residual, attn_drop=attn_drop_rate
        )
        self.blocks = nn.ModuleList(
            [
                DeiTBlock(
                    embed_dim,
                    num_heads,
                    kind=kinds[i],
                    mlp_ratio=mlp_ratio,
                    drop=drop_rate,
                    drop_path=dpr[i],
                    norm_layer=norm_layer,
                    **attention,
                )
                for i in range(depth)
            ]
        )
        self.norm = norm_layer(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()

        reduction = self.patch_embed.patch_size[0]
        self.init_contract([dict(num_chs=embed_dim, reduction=reduction, module=f"blocks.{i}") for i in range(depth)])
        self.set_impl(impl)
        self._init_weights()

    def _init_weights(self) -> None:
        # as the reference (timm ViT, mode ''): trunc-normal 0.02 for pos_embed and the cls token,
        # then the shared linear / LayerNorm init
        trunc_normal_(self.pos_embed, std=0.02)
        trunc_normal_(self.cls_token, std=0.02)
        init_weights_(self)

    def _pos_embed(self, x: torch.Tensor, feat_size: tuple[int, int]) -> torch.Tensor:
        """x: [B, H*W, C] patch tokens -> [B, 1 + H*W, C] with cls token and position embedding."""
        pos_cls, pos_grid = self.pos_embed[:, :1], self.pos_embed[:, 1:]
        pos_grid = resize_pos_embed(pos_grid, self.patch_embed.grid_size, feat_size)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.pos_drop(x + torch.cat([pos_cls, pos_grid], dim=1))

    def forward(self, x: torch.Tensor):
        """images [B, C_in, H, W] -> logits [B, num_classes] (a features_only model: its maps)."""
        return self._forward(x)  # a frame of this class's own for torch.compile (see InLineModel)

    # ---- the contract's hooks (state: tokens [B, 1 + H*W, C] and the grid (H, W))

    def _stem(self, x: torch.Tensor):
        x, feat_size = self.patch_embed(x)
        return self._pos_embed(x, feat_size), feat_size

    def _run_level(self, i: int, state):
        x, feat_size = state
        return self.checkpointed(self.blocks[i], x, feat_size), feat_size

    def _level_map(self, i: int, state, norm: bool) -> torch.Tensor:
        x, feat_size = state
        x = self.norm(x) if norm else x
        return tokens_to_nchw(x[:, self.num_prefix_tokens :], feat_size)  # patch tokens only

    def _final(self, state, i: int) -> torch.Tensor:
        """-> normalized tokens [B, 1 + (H/p)(W/p), C] (cls first)."""
        return self.norm(state[0])

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0] if self.global_pool == "token" else x[:, self.num_prefix_tokens :].mean(dim=1)

    def _level_modules(self, i: int) -> list[str]:
        return [f"blocks.{i}"]

    def _stem_modules(self) -> list[str]:
        return ["patch_embed", "cls_token", "pos_embed"]

    def stage_prefixes(self, num_stages: int = 4) -> tuple[list[str], list[list[str]]]:
        """As :meth:`InLineModel.stage_prefixes`, the blocks split into ``num_stages`` equal groups."""
        depth = len(self.blocks)
        bounds = [round(depth * i / num_stages) for i in range(num_stages + 1)]
        stages = [[f"blocks.{j}." for j in range(bounds[i], bounds[i + 1])] for i in range(num_stages)]
        return ["patch_embed.", "cls_token", "pos_embed"], stages


def checkpoint_filter_fn(state_dict: dict, model: InLineDeiT) -> dict:
    """Map a reference DeiT state dict onto ``model`` (used by load_checkpoint).

    The names agree already; a position embedding of another (square) grid is resized to the
    model's (cls entry kept, grid bilinear).
    """
    out = dict(state_dict)
    pos = out.get("pos_embed")
    if isinstance(pos, torch.Tensor) and pos.dim() == 3 and pos.shape != model.pos_embed.shape:
        n_old = pos.shape[1] - model.num_prefix_tokens
        side = int(round(n_old**0.5))
        if side * side == n_old and pos.shape[2] == model.pos_embed.shape[2]:
            grid = resize_pos_embed(pos[:, model.num_prefix_tokens :], (side, side), model.patch_embed.grid_size)
            out["pos_embed"] = torch.cat([pos[:, : model.num_prefix_tokens], grid], dim=1)
    return out


InLineDeiT.checkpoint_filter_fn = staticmethod(checkpoint_filter_fn)

# ---- registered variants

_REFERENCE = "LeapLabTHU/InLine models/inline_deit.py:VisionTransformer"
_TINY = dict(img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=6, pattern="I", drop_path_rate=0.1)
_SMALL = dict(_TINY, img_size=288, embed_dim=320, num_heads=10)
_BASE = dict(_TINY, img_size=448, embed_dim=384, num_heads=12)

# the authors evaluate with the Swin codebase's pipeline: resize 256/224 of the side, centre crop 0.875,
# bicubic, ImageNet mean/std (their timm _cfg metadata says crop 0.9; not what they ran)
_FAMILY = Family(InLineDeiT, "deit", reference=_REFERENCE, first_conv="patch_embed.proj")
# size, title, defaults, then the paper's top-1 (%), parameters and GMACs
inline_deit_tiny = _FAMILY.variant("tiny", "InLine-DeiT-T (224)", _TINY, 74.5, 6_477_736, 1.11)
inline_deit_small = _FAMILY.variant("small", "InLine-DeiT-S (288)", _SMALL, 80.2, 16_734_760, 4.97)
inline_deit_base = _FAMILY.variant("base", "InLine-DeiT-B (448)", _BASE, 82.3, 23_797_096, 17.17)
