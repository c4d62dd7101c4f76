"""InLine-PVT: the Pyramid Vision Transformer with InLine attention (paper Sec. 5.1, SPEC section 3).

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

import re
from functools import partial
from typing import Optional, Sequence, Union

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from ..layers import PreNormBlock, RecordableAttention, TokenAttention, check_heads, init_weights_
from ._helpers import PatchEmbed, parse_pattern, resize_pos_embed, take_indices, tokens_to_nchw
from .registry import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, ModelConfig, register_model

__all__ = ["PVTAttention", "PVTBlock", "PyramidVisionTransformer", "SpatialReductionAttention", "checkpoint_filter_fn"]


class PVTAttention(TokenAttention):
    """InLine (or linear / full softmax) attention with PVT's separate ``q`` / ``kv`` projections.

    InLine output per head (SPEC section 1, the reference's scale):
    ``O_i = sum_j w_ij V_j`` with ``w_ij = (1 + d^-0.5 phi(Q_i).(phi(K_j) - k_bar)) / N``, plus the
    predicted 3x3 local residual on V (SPEC section 2; context = mean token of the input).

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

    def __init__(self, dim: int, num_heads: int, *, sr_ratio: int = 1, qkv_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__()
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = check_heads(dim, num_heads)
        self.scale = self.head_dim ** -0.5
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
                    f"feature map {h}x{w} is smaller than the spatial reduction {self.sr_ratio}: "
                    f"use a larger input"
                )
            src = self.norm(self.sr(tokens_to_nchw(x, (h, w))).flatten(2).transpose(1, 2))
        kv = self.kv(src).view(b, src.shape[1], 2, self.num_heads, self.head_dim)
        k, v = (t.transpose(1, 2) for t in kv.unbind(2))
        out = self.attend(q, k, v, feat_size=(h, w), kind="softmax", scale=self.scale,
                          attn_drop=self.attn_drop)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, sr_ratio={self.sr_ratio}"


class PVTBlock(PreNormBlock):
    """Pre-norm block over ``[B, H*W, C]``: InLine / linear attention without spatial reduction,
    or PVT's softmax attention with spatial reduction ``sr_ratio``."""

    def __init__(self, dim: int, num_heads: int, *, kind: str = "inline", mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, kernel: Optional[str] = None, local_residual: Optional[bool] = None,
                 sr_ratio: int = 1, drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 norm_layer=nn.LayerNorm):
        if kind == "softmax":
            if local_residual:
                raise ValueError("PVT softmax blocks (spatial reduction) take no local residual")
            attn = SpatialReductionAttention(dim, num_heads, sr_ratio=sr_ratio, qkv_bias=qkv_bias,
                                             attn_drop=attn_drop, proj_drop=drop)
        else:
            attn = PVTAttention(dim, num_heads, kind=kind, qkv_bias=qkv_bias, kernel=kernel,
                                local_residual=local_residual, attn_drop=attn_drop, proj_drop=drop)
        super().__init__(dim, attn, mlp_ratio=mlp_ratio, drop=drop, drop_path=drop_path, norm_layer=norm_layer)


class PyramidVisionTransformer(nn.Module):
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
        kernel, local_residual: InLine / linear options (None = the kind's default).
        features_only: forward returns the NCHW maps of ``out_indices`` (default all 4 stages).
    """

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
        kernel: Optional[str] = None,
        local_residual: Optional[bool] = None,
        global_pool: str = "avg",
        norm_eps: float = 1e-6,
        features_only: bool = False,
        out_indices: Optional[Sequence[int]] = None,
    ):
        super().__init__()
        num_stages = len(depths)
        for arg, val in (("embed_dims", embed_dims), ("num_heads", num_heads), ("mlp_ratios", mlp_ratios),
                         ("sr_ratios", sr_ratios)):
            if len(val) != num_stages:
                raise ValueError(f"{arg}={tuple(val)} must have one entry per stage ({num_stages} stages)")
        if global_pool != "avg":
            raise ValueError(f"global_pool must be 'avg' (PVT has no cls token), got {global_pool!r}")
        kinds = parse_pattern(pattern, depths)
        norm_layer = partial(nn.LayerNorm, eps=norm_eps)
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_stages = num_stages
        self.depths = tuple(depths)
        self.embed_dims = tuple(embed_dims)
        self.num_features = embed_dims[-1]
        self.num_prefix_tokens = 0
        self.pattern = pattern
        self.grad_checkpointing = False

        total = sum(depths)
        dpr = [drop_path_rate * i / max(total - 1, 1) for i in range(total)]
        img_size = tuple(int(s) for s in (img_size if isinstance(img_size, (tuple, list)) else (img_size, img_size)))
        self.feature_info = []
        cur, stride = 0, 1
        for i in range(num_stages):
            p = patch_size if i == 0 else 2
            size = img_size if i == 0 else prev_grid
            embed = PatchEmbed(size, p, in_chans if i == 0 else embed_dims[i - 1], embed_dims[i],
                               norm_layer=nn.LayerNorm, is_stem=i == 0)  # default eps here, as the reference
            prev_grid = embed.grid_size
            stride *= p
            setattr(self, f"patch_embed{i + 1}", embed)
            setattr(self, f"pos_embed{i + 1}", nn.Parameter(torch.zeros(1, embed.num_patches, embed_dims[i])))
            setattr(self, f"pos_drop{i + 1}", nn.Dropout(drop_rate))
            setattr(self, f"block{i + 1}", nn.ModuleList([
                PVTBlock(embed_dims[i], num_heads[i], kind=kinds[i][j], mlp_ratio=mlp_ratios[i], qkv_bias=qkv_bias,
                         kernel=kernel, local_residual=local_residual if kinds[i][j] != "softmax" else None,
                         sr_ratio=sr_ratios[i], drop=drop_rate, attn_drop=attn_drop_rate,
                         drop_path=dpr[cur + j], norm_layer=norm_layer)
                for j in range(depths[i])
            ]))
            cur += depths[i]
            self.feature_info.append(dict(num_chs=embed_dims[i], reduction=stride, module=f"block{i + 1}"))
        self.head = nn.Linear(embed_dims[-1], num_classes) if num_classes > 0 else nn.Identity()
        self._init_weights()

        self.features_only = features_only
        if features_only:
            self.out_indices = take_indices(num_stages, out_indices)
            self.feature_info = [self.feature_info[i] for i in self.out_indices]
            self.head = nn.Identity()
            self.num_classes = 0
            for i in range(max(self.out_indices) + 1, num_stages):  # unused later stages
                for prefix in ("patch_embed", "pos_embed", "pos_drop", "block"):
                    delattr(self, f"{prefix}{i + 1}")
            self.num_stages = max(self.out_indices) + 1

    def _init_weights(self) -> None:
        # as the reference: trunc-normal 0.02 for the position embeddings, then the shared
        # linear / LayerNorm init (convs keep PyTorch's default)
        for i in range(self.num_stages):
            nn.init.trunc_normal_(getattr(self, f"pos_embed{i + 1}"), std=0.02)
        init_weights_(self)

    # ---- timm-style contract -------------------------------------------------------------
    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {f"pos_embed{i + 1}" for i in range(self.num_stages)}

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = bool(enable)

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        if global_pool not in (None, "avg"):
            raise ValueError(f"global_pool must be 'avg', got {global_pool!r}")
        self.num_classes = num_classes
        dev = self.pos_embed1.device
        self.head = nn.Linear(self.num_features, num_classes, device=dev) if num_classes > 0 else nn.Identity()

    def _stage(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Stage i (0-based): x [B, C_prev, H, W] -> [B, C_i, H / s, W / s]."""
        embed: PatchEmbed = getattr(self, f"patch_embed{i + 1}")
        x, feat_size = embed(x)
        pos = resize_pos_embed(getattr(self, f"pos_embed{i + 1}"), embed.grid_size, feat_size)
        x = getattr(self, f"pos_drop{i + 1}")(x + pos)
        for blk in getattr(self, f"block{i + 1}"):
            if self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
                x = checkpoint(blk, x, feat_size, use_reentrant=False)
            else:
                x = blk(x, feat_size)
        return tokens_to_nchw(x, feat_size)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, C_in, H, W] -> last stage map [B, C_4, H/32, W/32]."""
        for i in range(self.num_stages):
            x = self._stage(i, x)
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """x: [B, C, H, W] -> logits (mean over tokens, no final norm, as the reference)."""
        x = x.mean(dim=(2, 3))
        return x if pre_logits else self.head(x)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: Union[None, int, Sequence[int]] = None,
        norm: bool = False,
        intermediates_only: bool = False,
    ):
        """Stage outputs as NCHW maps at strides 4, 8, 16, 32.

        indices: None = all stages, int n = the last n, or a list of stage indices.
        norm: accepted for the common signature; PVT has no final norm.
        Returns the maps, or (last stage map, maps) unless intermediates_only.
        """
        take = take_indices(self.num_stages, indices)
        maps = []
        for i in range(self.num_stages):
            x = self._stage(i, x)
            if i in take:
                maps.append(x)
            if intermediates_only and i >= take[-1]:
                return maps
        return maps if intermediates_only else (x, maps)

    def forward(self, x: torch.Tensor):
        if self.features_only:
            return self.forward_intermediates(x, self.out_indices, intermediates_only=True)
        return self.forward_head(self.forward_features(x))



def checkpoint_filter_fn(state_dict: dict, model: PyramidVisionTransformer) -> dict:
    """Map a reference PVT state dict onto ``model`` (used by load_checkpoint).

    The names agree already; per-stage position embeddings of another (square) grid are
    resized to the model's, and a ``features_only`` model drops the file's entries for the
    parts it pruned (head, later stages).
    """
    out = dict(state_dict)
    if model.features_only:
        own = model.state_dict()

        def pruned(key: str) -> bool:
            m = re.match(r"(patch_embed|pos_embed|block)(\d+)", key)
            return key.startswith("head.") or (m is not None and int(m.group(2)) > model.num_stages)

        out = {k: v for k, v in out.items() if k in own or not pruned(k)}
    for i in range(model.num_stages):
        key = f"pos_embed{i + 1}"
        pos, mine = out.get(key), getattr(model, key)
        if isinstance(pos, torch.Tensor) and pos.dim() == 3 and pos.shape != mine.shape and pos.shape[2] == mine.shape[2]:
            side = int(round(pos.shape[1] ** 0.5))
            if side * side == pos.shape[1]:
                out[key] = resize_pos_embed(pos, (side, side), getattr(model, f"patch_embed{i + 1}").grid_size)
    return out


PyramidVisionTransformer.checkpoint_filter_fn = staticmethod(checkpoint_filter_fn)


# ---- registered variants (SPEC section 3; heads and MLP ratios as the reference code builds) ----

def _cfg(name: str, top1: float, params: int, macs: float, drop_path: float) -> ModelConfig:
    # evaluated with the Swin codebase's pipeline (crop 0.875, ImageNet mean/std); the reference's
    # timm _cfg metadata (crop 0.9, mean/std 0.5) is kept in extra for the record
    return ModelConfig(
        name=name, family="pvt", input_size=(3, 224, 224), crop_pct=0.875, interpolation="bicubic",
        mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD, classifier="head",
        first_conv="patch_embed1.proj", paper_top1=top1, num_params=params, macs_g=macs,
        extra=dict(pattern="IIII", drop_path_rate=drop_path,
                   reference_class="models/inline_pvt.py:PyramidVisionTransformer",
                   reference_cfg_crop_pct=0.9, reference_cfg_mean_std=(0.5, 0.5)),
    )


_PVT = dict(img_size=224, patch_size=4, embed_dims=(64, 128, 320, 512), num_heads=(2, 4, 10, 16),
            mlp_ratios=(8, 8, 4, 4), sr_ratios=(8, 4, 2, 1), qkv_bias=True, pattern="IIII")


def _create(depths, drop_path: float, overrides: dict) -> PyramidVisionTransformer:
    return PyramidVisionTransformer(**{**_PVT, "depths": depths, "drop_path_rate": drop_path, **overrides})


@register_model(_cfg("inline_pvt_tiny", 78.2, 12_032_232, 1.98, 0.1))
def inline_pvt_tiny(**overrides) -> PyramidVisionTransformer:
    return _create((2, 2, 2, 2), 0.1, overrides)


@register_model(_cfg("inline_pvt_small", 82.0, 21_556_136, 3.91, 0.1))
def inline_pvt_small(**overrides) -> PyramidVisionTransformer:
    return _create((3, 4, 6, 3), 0.1, overrides)


@register_model(_cfg("inline_pvt_medium", 83.2, 37_618_856, 6.86, 0.3))
def inline_pvt_medium(**overrides) -> PyramidVisionTransformer:
    return _create((3, 4, 18, 3), 0.3, overrides)


@register_model(_cfg("inline_pvt_large", 83.6, 51_154_280, 10.13, 0.3))
def inline_pvt_large(**overrides) -> PyramidVisionTransformer:
    return _create((3, 8, 27, 3), 0.3, overrides)
