"""Stand-ins for timm's and torchvision's attention modules and small models around them, which
neither library's import allows here: the same constructor arguments, attribute names and forward
signatures as the real classes (timm: ``layers/attention.py`` ``Attention``, ``swin_transformer.py``
``WindowAttention``, ``eva.py`` ``EvaAttention`` / ``Eva``; torchvision: ``models/vision_transformer.py``
``EncoderBlock`` with its ``nn.MultiheadAttention``), written here in our own words; softmax through SDPA."""

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


class EvaAttention(nn.Module):
    """timm's ``EvaAttention``: ``forward(x, rope=None, attn_mask=None, is_causal=False)``; fused qkv
    without bias, its Q and V biases separate parameters and K's a zero non-persistent buffer."""

    def __init__(
        self,
        dim,
        num_heads=8,
        qkv_bias=True,
        qkv_fused=True,
        qkv_bias_separate=False,
        num_prefix_tokens=1,
        attn_drop=0.0,
        proj_drop=0.0,
        attn_head_dim=None,
        norm_layer=None,
        qk_norm=False,
        scale_norm=True,
        rotate_half=False,
        gated=False,
    ):
        super().__init__()
        assert norm_layer is not None or not (scale_norm or qk_norm), "scale_norm / qk_norm need norm_layer"
        self.num_heads = num_heads
        self.head_dim = attn_head_dim or dim // num_heads
        attn_dim = self.head_dim * num_heads
        self.scale = self.head_dim**-0.5
        self.num_prefix_tokens, self.qkv_bias_separate, self.rotate_half = (
            num_prefix_tokens,
            qkv_bias_separate,
            rotate_half,
        )
        self.fused_attn = True
        if qkv_fused:
            self.qkv = nn.Linear(dim, attn_dim * 3, bias=False)
            self.q_proj = self.k_proj = self.v_proj = None
            if qkv_bias:
                self.q_bias = nn.Parameter(torch.zeros(attn_dim))
                self.register_buffer("k_bias", torch.zeros(attn_dim), persistent=False)
                self.v_bias = nn.Parameter(torch.zeros(attn_dim))
            else:
                self.q_bias = self.k_bias = self.v_bias = None
        else:
            self.q_proj = nn.Linear(dim, attn_dim, bias=qkv_bias)
            self.k_proj = nn.Linear(dim, attn_dim, bias=False)
            self.v_proj = nn.Linear(dim, attn_dim, bias=qkv_bias)
            self.qkv = None
            self.q_bias = self.k_bias = self.v_bias = None
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(attn_dim) if scale_norm else nn.Identity()
        self.gate = nn.Linear(dim, attn_dim, bias=qkv_bias) if gated else None
        self.proj = nn.Linear(attn_dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x, rope=None, attn_mask=None, is_causal=False):
        b, n, c = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        if self.qkv is not None:
            if self.q_bias is None:
                qkv = self.qkv(x)
            else:
                bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
                qkv = self.qkv(x) + bias if self.qkv_bias_separate else F.linear(x, self.qkv.weight, bias)
            q, k, v = qkv.reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        else:
            q, k, v = (
                p(x).reshape(b, n, self.num_heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj)
            )
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            p = self.num_prefix_tokens
            q = torch.cat([q[:, :, :p], _rotate(q[:, :, p:], rope)], dim=2)
            k = torch.cat([k[:, :, :p], _rotate(k[:, :, p:], rope)], dim=2)
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        x = self.norm(x.transpose(1, 2).reshape(b, n, c))
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))


def _rotate(x, rope):
    """timm's ``apply_rot_embed_cat`` (interleaved): rope [N, 2 d] holds sin then cos."""
    sin, cos = rope.tensor_split(2, -1)
    return x * cos + torch.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape) * sin


class RotaryEmbedding(nn.Module):
    """A stand-in for timm's ``RotaryEmbeddingCat``: ``get_embed(shape)`` -> [H * W, 2 head_dim]."""

    def __init__(self, head_dim):
        super().__init__()
        self.register_buffer("bands", 1.0 / 100 ** torch.linspace(0, 1, head_dim // 4), persistent=False)

    def get_embed(self, shape):
        h, w = shape
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        angles = torch.cat([ys.reshape(-1, 1) * self.bands, xs.reshape(-1, 1) * self.bands], -1)
        angles = angles.repeat_interleave(2, -1)
        return torch.cat([angles.sin(), angles.cos()], -1)


class EvaBlock(nn.Module):
    def __init__(self, dim, num_heads, qkv_fused=True):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = EvaAttention(dim, num_heads, qkv_fused=qkv_fused, norm_layer=nn.LayerNorm)
        self.norm2, self.mlp = (
            nn.LayerNorm(dim),
            nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)),
        )

    def forward(self, x, rope=None, attn_mask=None, is_causal=False):
        x = x + self.attn(self.norm1(x), rope=rope, attn_mask=attn_mask, is_causal=is_causal)
        return x + self.mlp(self.norm2(x))


class Eva(nn.Module):
    """A small timm-style ``Eva`` (cls token, sub-LN attention), any input size (no position
    embedding); ``use_rot_pos_emb=True`` adds its ``rope`` module, whose embeddings every block takes."""

    def __init__(self, dim=32, depth=2, num_heads=4, num_classes=10, qkv_fused=True, use_rot_pos_emb=False):
        super().__init__()
        self.num_prefix_tokens = 1
        self.patch_embed = PatchEmbed(embed_dim=dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.rope = RotaryEmbedding(dim // num_heads) if use_rot_pos_emb else None
        self.blocks = nn.ModuleList([EvaBlock(dim, num_heads, qkv_fused) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed.proj(x)
        rope = self.rope.get_embed(x.shape[-2:]) if self.rope is not None else None
        x = x.flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        for block in self.blocks:
            x = block(x, rope=rope)
        return self.head(self.norm(x)[:, 0])
