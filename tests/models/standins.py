"""Stand-ins for timm's and torchvision's attention modules and small models around them, which
neither library's import allows here: the same constructor arguments, attribute names and forward
signatures as the real classes (timm: ``layers/attention.py`` ``Attention``, ``swin_transformer.py``
``WindowAttention``; torchvision: ``models/vision_transformer.py`` ``EncoderBlock`` with its
``nn.MultiheadAttention``), written here in our own words; softmax through SDPA."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    """timm's ``Attention``: ``forward(x, attn_mask=None, is_causal=False)``."""

    def __init__(self, dim, num_heads=8, qkv_bias=False, proj_bias=True, attn_drop=0.0, proj_drop=0.0):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.attn_dim = dim
        self.scale = self.head_dim**-0.5
        self.fused_attn = True
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm, self.k_norm = nn.Identity(), nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x, attn_mask=None, is_causal=False):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        return self.proj_drop(self.proj(self.norm(x.transpose(1, 2).reshape(b, n, self.attn_dim))))


class PatchEmbed(nn.Module):
    """timm's ``PatchEmbed`` (flatten, dynamic image size): ``proj`` a strided Conv2d."""

    def __init__(self, patch_size=4, in_chans=1, embed_dim=32):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, patch_size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class Block(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, num_heads, qkv_bias=True)
        self.norm2, self.mlp = (
            nn.LayerNorm(dim),
            nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)),
        )

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """A small timm-style ViT (cls token, ``num_prefix_tokens``), any input size (no position embedding)."""

    def __init__(self, dim=32, depth=2, num_heads=4, num_classes=10):
        super().__init__()
        self.num_prefix_tokens = 1
        self.patch_embed = PatchEmbed(embed_dim=dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, num_heads) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.head(self.norm(self.blocks(x))[:, 0])


class WindowAttention(nn.Module):
    """timm Swin's ``WindowAttention``: ``forward(x, mask=None)`` on [B * windows, Wh * Ww, C]."""

    def __init__(self, dim, num_heads, head_dim=None, window_size=7, qkv_bias=True, attn_drop=0.0, proj_drop=0.0):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim or dim // num_heads
        self.attn_dim = self.head_dim * num_heads
        self.scale = self.head_dim**-0.5
        self.window_size = (window_size, window_size)
        self.window_area = window_size * window_size
        self.relative_position_bias_table = nn.Parameter(torch.randn((2 * window_size - 1) ** 2, num_heads) * 0.02)
        coords = torch.stack(
            torch.meshgrid(torch.arange(window_size), torch.arange(window_size), indexing="ij")
        ).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + window_size - 1
        self.register_buffer(
            "relative_position_index", rel[..., 0] * (2 * window_size - 1) + rel[..., 1], persistent=False
        )
        self.qkv = nn.Linear(dim, self.attn_dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(self.attn_dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x, mask=None):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        bias = bias.view(n, n, -1).permute(2, 0, 1)[None]
        if mask is not None:
            bias = (bias.view(-1, mask.shape[0], self.num_heads, n, n) + mask[None, :, None]).view(
                -1, self.num_heads, n, n
            )
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(b, n, -1)))


class SwinStage(nn.Module):
    """One Swin stage's windowing around WindowAttention (no shift): [B, H, W, C] -> [B, H, W, C]."""

    def __init__(self, dim=32, num_heads=4, window_size=4):
        super().__init__()
        self.window_size = window_size
        self.norm = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, num_heads, window_size=window_size)

    def forward(self, x):
        b, h, w, c = x.shape
        ws = self.window_size
        win = self.norm(x).view(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)
        out = self.attn(win).view(b, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
        return x + out


class EncoderBlock(nn.Module):
    """torchvision's ViT ``EncoderBlock``: ``self_attention`` an ``nn.MultiheadAttention(batch_first=True)``
    called ``(x, x, x, need_weights=False)``."""

    def __init__(self, num_heads, hidden_dim, mlp_dim):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden_dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(hidden_dim, num_heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(hidden_dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(hidden_dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, hidden_dim))

    def forward(self, input):
        x = self.ln_1(input)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = x + input
        return x + self.mlp(self.ln_2(x))


class TorchvisionViT(nn.Module):
    """torchvision's ``VisionTransformer`` layout: ``conv_proj``, ``class_token``, ``encoder.layers``."""

    def __init__(self, patch_size=4, hidden_dim=32, num_heads=4, num_layers=2, num_classes=10):
        super().__init__()
        self.conv_proj = nn.Conv2d(1, hidden_dim, patch_size, patch_size)
        self.class_token = nn.Parameter(torch.zeros(1, 1, hidden_dim))
        self.encoder = nn.Module()
        self.encoder.layers = nn.Sequential(
            *[EncoderBlock(num_heads, hidden_dim, 2 * hidden_dim) for _ in range(num_layers)]
        )
        self.heads = nn.Linear(hidden_dim, num_classes)

    def forward(self, x):
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.heads(self.encoder.layers(x)[:, 0])
