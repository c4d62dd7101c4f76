"""InLine-DeiT: a DeiT/ViT with InLine attention in every block (paper Sec. 5.1, SPEC section 3).

Layout and state-dict names follow the reference (``patch_embed.proj``, ``cls_token``,
``pos_embed``, ``blocks.<i>.{norm1,attn,norm2,mlp}``, ``norm``, ``head``), so the authors'
checkpoints load unchanged. Beyond the reference: any input size (the position embedding is
resized bilinearly when the patch grid differs from the built one), softmax / linear ablations
(``pattern``), multi-scale features and gradient checkpointing.
"""
from __future__ import annotations

from functools import partial
from typing import Optional, Sequence, Union

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from ..layers import PreNormBlock, TokenAttention, init_weights_
from ._helpers import PatchEmbed, parse_pattern, resize_pos_embed, take_indices, tokens_to_nchw
from .registry import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, ModelConfig, register_model

__all__ = ["Block", "VisionTransformer", "checkpoint_filter_fn"]


class Block(PreNormBlock):
    """Pre-norm transformer block over ``[B, P + H*W, C]`` with P prefix tokens (the cls token).

    The residual context is the mean over all tokens (cls included) of norm1(x), TokenAttention's
    default, as in the reference.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        kind: str = "inline",
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        kernel: Optional[str] = None,
        local_residual: Optional[bool] = None,
        num_prefix_tokens: int = 1,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        norm_layer=nn.LayerNorm,
    ):
        attn = TokenAttention(
            dim, num_heads, kind=kind, qkv_bias=qkv_bias, kernel=kernel, local_residual=local_residual,
            num_prefix_tokens=num_prefix_tokens, attn_drop=attn_drop, proj_drop=drop,
        )
        super().__init__(dim, attn, mlp_ratio=mlp_ratio, drop=drop, drop_path=drop_path, norm_layer=norm_layer)


class VisionTransformer(nn.Module):
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
        kernel: phi of InLine/linear attention (None = the kind's default).
        local_residual: the 3x3 local residual (None = on for InLine only).
        global_pool: "token" (the cls token, as the reference) or "avg" (mean of patch tokens).
        features_only: build a backbone whose forward returns NCHW maps of ``out_indices``.
        out_indices: blocks whose outputs are returned with ``features_only`` (default: last).
    """

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
        kernel: Optional[str] = None,
        local_residual: Optional[bool] = None,
        global_pool: str = "token",
        features_only: bool = False,
        out_indices: Optional[Sequence[int]] = None,
    ):
        super().__init__()
        if global_pool not in ("token", "avg"):
            raise ValueError(f"global_pool must be 'token' or 'avg', got {global_pool!r}")
        if depth <= 0:
            raise ValueError(f"depth must be positive, got {depth}")
        kinds = parse_pattern(pattern, [depth])[0]
        norm_layer = partial(nn.LayerNorm, eps=1e-6)
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.embed_dim = embed_dim
        self.num_prefix_tokens = 1
        self.pattern = pattern
        self.grad_checkpointing = False

        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + 1, embed_dim))
        self.pos_drop = nn.Dropout(drop_rate)
        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]  # stochastic depth decay
        self.blocks = nn.ModuleList([
            Block(
                embed_dim, num_heads, kind=kinds[i], mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, kernel=kernel,
                local_residual=local_residual, num_prefix_tokens=1, drop=drop_rate,
                attn_drop=attn_drop_rate, drop_path=dpr[i], norm_layer=norm_layer,
            )
            for i in range(depth)
        ])
        self.norm = norm_layer(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()

        reduction = self.patch_embed.patch_size[0]
        self.feature_info = [
            dict(num_chs=embed_dim, reduction=reduction, module=f"blocks.{i}") for i in range(depth)
        ]
        self._init_weights()

        self.features_only = features_only
        if features_only:
            self.out_indices = take_indices(depth, [depth - 1] if out_indices is None else out_indices)
            self.feature_info = [self.feature_info[i] for i in self.out_indices]
            # a backbone: drop what the chosen maps do not use (timm's prune_intermediate_layers)
            del self.blocks[max(self.out_indices) + 1:]
            self.norm = nn.Identity()
            self.head = nn.Identity()
            self.num_classes = 0

    def _init_weights(self) -> None:
        # as the reference (timm ViT, mode ''): trunc-normal 0.02 for pos_embed and the cls token,
        # then the shared linear / LayerNorm init
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        init_weights_(self)

    # ---- timm-style contract -------------------------------------------------------------
    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "cls_token"}

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = bool(enable)

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        if global_pool is not None:
            if global_pool not in ("token", "avg"):
                raise ValueError(f"global_pool must be 'token' or 'avg', got {global_pool!r}")
            self.global_pool = global_pool
        self.num_classes = num_classes
        dev = self.cls_token.device
        self.head = nn.Linear(self.embed_dim, num_classes, device=dev) if num_classes > 0 else nn.Identity()

    def _pos_embed(self, x: torch.Tensor, feat_size: tuple[int, int]) -> torch.Tensor:
        """x: [B, H*W, C] patch tokens -> [B, 1 + H*W, C] with cls token and position embedding."""
        pos_cls, pos_grid = self.pos_embed[:, :1], self.pos_embed[:, 1:]
        pos_grid = resize_pos_embed(pos_grid, self.patch_embed.grid_size, feat_size)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.pos_drop(x + torch.cat([pos_cls, pos_grid], dim=1))

    def _run_block(self, blk: Block, x: torch.Tensor, feat_size: tuple[int, int]) -> torch.Tensor:
        if self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
            return checkpoint(blk, x, feat_size, use_reentrant=False)
        return blk(x, feat_size)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, C_in, H, W] -> normalized tokens [B, 1 + (H/p)(W/p), C] (cls first)."""
        x, feat_size = self.patch_embed(x)
        x = self._pos_embed(x, feat_size)
        for blk in self.blocks:
            x = self._run_block(blk, x, feat_size)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """x: [B, 1 + N, C] tokens -> logits [B, classes] (or pooled [B, C] with pre_logits)."""
        x = x[:, 0] if self.global_pool == "token" else x[:, self.num_prefix_tokens:].mean(dim=1)
        return x if pre_logits else self.head(x)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: Union[None, int, Sequence[int]] = None,
        norm: bool = False,
        intermediates_only: bool = False,
    ):
        """Block outputs as NCHW maps [B, C, H/p, W/p] (patch tokens only).

        indices: None = every block, int n = the last n, or a list of block indices.
        norm: apply the final LayerNorm to the returned maps.
        Returns the list of maps, or (final normalized tokens, maps) unless intermediates_only.
        """
        take = take_indices(len(self.blocks), indices)
        x, feat_size = self.patch_embed(x)
        x = self._pos_embed(x, feat_size)
        maps = []
        for i, blk in enumerate(self.blocks):
            x = self._run_block(blk, x, feat_size)
            if i in take:
                y = self.norm(x) if norm else x
                maps.append(tokens_to_nchw(y[:, self.num_prefix_tokens:], feat_size))
            if intermediates_only and i >= take[-1]:
                return maps
        return maps if intermediates_only else (self.norm(x), maps)

    def forward(self, x: torch.Tensor):
        if self.features_only:
            return self.forward_intermediates(x, self.out_indices, intermediates_only=True)
        return self.forward_head(self.forward_features(x))



def checkpoint_filter_fn(state_dict: dict, model: VisionTransformer) -> dict:
    """Map a reference DeiT state dict onto ``model`` (used by load_checkpoint).

    The names agree already; a position embedding of another (square) grid is resized to the
    model's (cls entry kept, grid bilinear), and a ``features_only`` model drops the file's
    entries for the parts it pruned (final norm, head, later blocks).
    """
    out = dict(state_dict)
    if model.features_only:
        own = model.state_dict()

        def pruned(key: str) -> bool:
            parts = key.split(".")
            late_block = parts[0] == "blocks" and parts[1].isdigit() and int(parts[1]) >= len(model.blocks)
            return late_block or parts[0] in ("norm", "head")

        out = {k: v for k, v in out.items() if k in own or not pruned(k)}
    pos = out.get("pos_embed")
    if isinstance(pos, torch.Tensor) and pos.dim() == 3 and pos.shape != model.pos_embed.shape:
        n_old = pos.shape[1] - model.num_prefix_tokens
        side = int(round(n_old ** 0.5))
        if side * side == n_old and pos.shape[2] == model.pos_embed.shape[2]:
            grid = resize_pos_embed(pos[:, model.num_prefix_tokens:], (side, side), model.patch_embed.grid_size)
            out["pos_embed"] = torch.cat([pos[:, : model.num_prefix_tokens], grid], dim=1)
    return out


VisionTransformer.checkpoint_filter_fn = staticmethod(checkpoint_filter_fn)


# ---- registered variants (SPEC section 3) ------------------------------------------------------

def _cfg(name: str, size: int, top1: float, params: int, macs: float) -> ModelConfig:
    # the authors evaluate with the Swin codebase's pipeline: resize 256/224 of the side, centre
    # crop, bicubic, ImageNet mean/std (their timm _cfg metadata says crop 0.9; not what they ran)
    return ModelConfig(
        name=name, family="deit", input_size=(3, size, size), crop_pct=0.875, interpolation="bicubic",
        mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD, classifier="head",
        first_conv="patch_embed.proj", paper_top1=top1, num_params=params, macs_g=macs,
        extra=dict(pattern="I", drop_path_rate=0.1, reference_class="models/inline_deit.py:VisionTransformer",
                   reference_cfg_crop_pct=0.9),
    )


def _create(defaults: dict, overrides: dict) -> VisionTransformer:
    return VisionTransformer(**{**defaults, **overrides})


@register_model(_cfg("inline_deit_tiny", 224, 74.5, 6_477_736, 1.11))
def inline_deit_tiny(**overrides) -> VisionTransformer:
    return _create(dict(img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=6, drop_path_rate=0.1), overrides)


@register_model(_cfg("inline_deit_small", 288, 80.2, 16_734_760, 4.97))
def inline_deit_small(**overrides) -> VisionTransformer:
    return _create(dict(img_size=288, patch_size=16, embed_dim=320, depth=12, num_heads=10, drop_path_rate=0.1), overrides)


@register_model(_cfg("inline_deit_base", 448, 82.3, 23_797_096, 17.17))
def inline_deit_base(**overrides) -> VisionTransformer:
    return _create(dict(img_size=448, patch_size=16, embed_dim=384, depth=12, num_heads=12, drop_path_rate=0.1), overrides)
