"""InLine-Swin: Swin Transformer with InLine attention in the early stages (paper Sec. 5, Table 5).

The layout follows the authors' ``models/inline_swin.py`` (state-dict names ``patch_embed``,
``layers.{i}.blocks.{j}.{norm1,attn,norm2,mlp}``, ``layers.{i}.downsample``, ``norm``, ``head``)
so their checkpoints load unchanged. Per block, the attention is one of

- InLine (``I``) or linear (``L``) attention inside windows of the configured size (56 at 224
  input: the whole stage-1 map, so these blocks are global). They use no shift mask, as in the
  reference: a shifted window simply wraps around.
- Softmax (``S``) window attention as in Swin: window ``max(7, window_size // 8)``
  (:func:`softmax_window`), relative
  position bias, shifted windows with the usual mask on odd blocks.

Beyond the reference, any input size works: blocks decide their windows from the actual map at
forward time (a window that covers an axis becomes that axis and does not shift along it), pad
the map to window multiples (as Swin does for detection: zeros after ``norm1``), build the shift
mask for the padded size (cached), and patch merging pads odd maps. At the published sizes
nothing is padded and the outputs equal the reference.

Internally the feature maps are NHWC ``[B, H, W, C]``.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

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
    to_2tuple,
)
from ._base import InLineModel
from ._cache import tensor_cache
from ._helpers import parse_pattern
from .checkpoint import RECOMPUTED_BUFFERS
from .registry import Family

__all__ = [
    "SOFTMAX_MIN_WINDOW",
    "SOFTMAX_WINDOW_DIVISOR",
    "InLineSwin",
    "PatchMerging",
    "SwinBlock",
    "SwinStage",
    "WindowAttention",
    "checkpoint_filter_fn",
    "relative_position_index",
    "resize_rel_pos_table",
    "shift_window_mask",
    "softmax_window",
    "window_partition",
    "window_reverse",
]

# Softmax blocks attend within windows of max(SOFTMAX_MIN_WINDOW, window_size // SOFTMAX_WINDOW_DIVISOR):
# Swin's 7 at the published InLine window 56 (12 at 96); bench's window preset inverts this rule.
SOFTMAX_MIN_WINDOW = 7
SOFTMAX_WINDOW_DIVISOR = 8
_MASK_VALUE = -100.0  # the reference's additive shift-mask value (exp(-100) ~ 4e-44: exact enough)


def softmax_window(window_size: int) -> int:
    """The window of the softmax blocks of a model whose InLine blocks use ``window_size``."""
    return max(SOFTMAX_MIN_WINDOW, window_size // SOFTMAX_WINDOW_DIVISOR)


# ---- helpers


def window_partition(x: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
    """x: [B, H, W, C] (H, W multiples of the window) -> [B * nW, wh * ww, C], batch-major."""
    b, h, w, c = x.shape
    wh, ww = window
    x = x.view(b, h // wh, wh, w // ww, ww, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b * (h // wh) * (w // ww), wh * ww, c)  # no -1: an empty batch has 0 elements


def window_reverse(windows: torch.Tensor, window: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """windows: [B * nW, wh * ww, C] -> [B, H, W, C] (inverse of :func:`window_partition`)."""
    wh, ww = window
    h, w = size
    c = windows.shape[-1]
    b = windows.shape[0] // ((h // wh) * (w // ww))
    x = windows.view(b, h // wh, w // ww, wh, ww, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, w, c)


def _region_ids(length: int, window: int, shift: int) -> torch.Tensor:
    # After a cyclic shift, the last window along an axis holds two regions that were not
    # neighbours in the image: [L - window, L - shift) and [L - shift, L).
    idx = torch.arange(length, device="cpu")
    if shift == 0:
        return torch.zeros_like(idx)
    return (idx >= length - window).long() + (idx >= length - shift).long()


def _make_shift_mask(size: tuple[int, int], window: tuple[int, int], shift: tuple[int, int]) -> torch.Tensor:
    """Uncached :func:`shift_window_mask` on the CPU (also for the state dict's buffers)."""
    (hp, wp), (wh, ww), (sh, sw) = size, window, shift
    labels = _region_ids(hp, wh, sh)[:, None] * 3 + _region_ids(wp, ww, sw)[None, :]  # [Hp, Wp]
    labels = window_partition(labels[None, :, :, None], (wh, ww)).squeeze(-1)  # [nW, N]
    differ = labels[:, None, :] != labels[:, :, None]
    return torch.zeros(differ.shape, dtype=torch.float32, device="cpu").masked_fill_(differ, _MASK_VALUE)


@tensor_cache(maxsize=64)
def shift_window_mask(
    size: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], device: torch.device
) -> torch.Tensor:
    """Additive mask for shifted-window attention on a (padded) map: [nW, N, N] float32.

    ``size`` (Hp, Wp) must be multiples of ``window`` (wh, ww); ``shift`` (sh, sw) is the cyclic
    shift. Pairs of tokens from different image regions get -100 (as the reference), others 0.
    Cached per geometry and device (never a tensor made while tracing; do not modify the result
    in place).
    """
    return _make_shift_mask(size, window, shift).to(device)


def _make_relative_position_index(window: tuple[int, int], table_window: tuple[int, int]) -> torch.Tensor:
    (wh, ww), (th, tw) = window, table_window
    coords = torch.stack(
        torch.meshgrid(torch.arange(wh, device="cpu"), torch.arange(ww, device="cpu"), indexing="ij")
    ).flatten(1)  # [2, N]
    rel = coords[:, :, None] - coords[:, None, :]  # [2, N, N]: offset of query i to key j
    return (rel[0] + th - 1) * (2 * tw - 1) + rel[1] + tw - 1


@tensor_cache(maxsize=64)
def relative_position_index(
    window: tuple[int, int], table_window: tuple[int, int], device: torch.device
) -> torch.Tensor:
    """[N, N] long index into a ``(2*th-1) * (2*tw-1)`` relative position table for a window.

    A window smaller than the table's (a map smaller than the table's window) indexes the same
    table, since its offsets are a subset. Cached per geometry and device (as :func:`shift_window_mask`).
    """
    return _make_relative_position_index(window, table_window).to(device)


def _window_grid_coords(
    size: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], device: torch.device
) -> torch.Tensor:
    """(row, col) in the padded map of every window token, after the cyclic shift: [nW, N, 2]."""
    hp, wp = size
    grid = torch.stack(
        torch.meshgrid(torch.arange(hp, device=device), torch.arange(wp, device=device), indexing="ij"), dim=-1
    )  # [Hp, Wp, 2]
    if any(shift):
        grid = torch.roll(grid, shifts=(-shift[0], -shift[1]), dims=(0, 1))
    return window_partition(grid[None], window)


# ---- modules


class WindowAttention(RecordableAttention):
    """Softmax window attention with a relative position bias (Swin's W-MSA / SW-MSA).

    Args:
        dim: channels C.
        num_heads: heads h.
        window_size: the window (and relative position table) size; a smaller window at forward
            time (a map smaller than the window) reuses the table.
        qkv_bias: bias of the fused qkv projection.
        attn_drop, proj_drop: dropout on the weights / after the output projection.
        impl: as :class:`~inline_attn.layers.TokenAttention`'s ("naive": explicit weights).
    """

    kind = "softmax"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        window_size: int,
        *,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        impl: Optional[str] = None,
    ):
        super().__init__(impl)
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = check_heads(dim, num_heads)
        self.scale = self.head_dim**-0.5
        self.window_size = to_2tuple(window_size)
        wh, ww = self.window_size
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * wh - 1) * (2 * ww - 1), num_heads))
        # persistent, as in the reference state dict; recomputable (see checkpoint_filter_fn)
        index = _make_relative_position_index(self.window_size, self.window_size)
        self.register_buffer("relative_position_index", index.to(torch.get_default_device()))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def relative_position_bias(self, window: tuple[int, int]) -> torch.Tensor:
        """The bias of a (wh, ww) window: [h, N, N]."""
        if tuple(window) == self.window_size:
            index = self.relative_position_index
        else:
            index = relative_position_index(tuple(window), self.window_size, self.relative_position_bias_table.device)
        n = window[0] * window[1]
        return self.relative_position_bias_table[index.reshape(-1)].view(n, n, -1).permute(2, 0, 1)

    def forward(
        self, x: torch.Tensor, feat_size: tuple[int, int], *, mask: Optional[torch.Tensor] = None, token_coords=None
    ) -> torch.Tensor:
        """x: [B * nW, N, C] windows of size feat_size = (wh, ww) -> [B * nW, N, C].

        mask: additive shift mask [nW, N, N] (windows batch-major, as from window_partition).
        """
        b_, n, c = x.shape
        wh, ww = feat_size
        if n != wh * ww or c != self.dim:
            raise ValueError(f"x must be [B*nW, {wh}*{ww}, {self.dim}] for window {feat_size}, got {tuple(x.shape)}")
        if wh > self.window_size[0] or ww > self.window_size[1]:
            raise ValueError(f"window {feat_size} exceeds the relative position table's window {self.window_size}")
        qkv = self.qkv(x).view(b_, n, 3, self.num_heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # [B*nW, h, N, d]
        bias = self.relative_position_bias((wh, ww)).unsqueeze(0)  # [1, h, N, N]
        if mask is not None:
            nw = mask.shape[0]
            if b_ % nw != 0:
                raise ValueError(f"{b_} windows are not a multiple of the mask's {nw} windows")
            mask = mask.to(x.dtype).unsqueeze(0).expand(b_ // nw, -1, -1, -1).reshape(b_, 1, n, n)
        out = self.attend(
            q,
            k,
            v,
            feat_size=(wh, ww),
            kind="softmax",
            scale=self.scale,
            bias=bias,
            mask=mask,
            token_coords=token_coords,
            attn_drop=self.attn_drop,
        )
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b_, n, c)))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, window_size={self.window_size}, num_heads={self.num_heads}"


class SwinBlock(PreNormBlock):
    """norm1 -> (shifted) window attention -> residual; norm2 -> MLP -> residual.

    Args:
        dim, num_heads: channels and heads.
        kind: "inline", "linear" or "softmax".
        window_size: the target window; at forward time an axis of the map no longer than the
            window gets a window equal to that axis and no shift along it.
        shift_size: cyclic shift (half a window on odd blocks, 0 on even ones).
        input_resolution: the map size at the constructed image size; decides (as in the
            reference) the persistent ``attn_mask`` buffer of the state dict only.
        options: :class:`~inline_attn.layers.BlockOptions` (mlp_ratio, qkv_bias, feature_map, ...;
            softmax blocks take no feature map or local residual).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        kind: str,
        window_size: int,
        shift_size: int,
        input_resolution: tuple[int, int],
        **options,
    ):
        if not 0 <= shift_size < window_size:
            raise ValueError(f"shift_size={shift_size} must lie in [0, window_size={window_size})")
        o = BlockOptions(**options)
        if kind == "softmax":
            attn = WindowAttention(dim, num_heads, window_size, **o.softmax())
        else:
            attn = TokenAttention(dim, num_heads, kind=kind, **o.attention())
        super().__init__(dim, attn, **o.mlp())
        self.kind = kind
        self.window_size, self.shift_size = window_size, shift_size
        # The reference keeps the constructed size's shift mask in the state dict (even for
        # InLine blocks, which ignore it); forward builds masks for the actual size instead.
        h, w = input_resolution
        if min(h, w) > window_size and shift_size > 0:
            hp, wp = (math.ceil(s / window_size) * window_size for s in (h, w))
            mask = _make_shift_mask((hp, wp), (window_size,) * 2, (shift_size,) * 2)
            self.register_buffer("attn_mask", mask.to(torch.get_default_device()))
        else:
            self.register_buffer("attn_mask", None)

    def window_geometry(self, h: int, w: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """Window (wh, ww) and shift (sh, sw) for an H x W map."""
        ws, ss = self.window_size, self.shift_size
        window = (min(ws, h), min(ws, w))
        shift = (0 if h <= ws else ss, 0 if w <= ws else ss)
        return window, shift

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, H, W, C] (after norm1) -> attention output [B, H, W, C]."""
        b, h, w, c = x.shape
        (wh, ww), (sh, sw) = self.window_geometry(h, w)
        pad_b, pad_r = (-h) % wh, (-w) % ww
        if pad_b or pad_r:
            x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))  # zeros, as Swin's detection backbone
        hp, wp = h + pad_b, w + pad_r
        if sh or sw:
            x = torch.roll(x, shifts=(-sh, -sw), dims=(1, 2))
        windows = window_partition(x, (wh, ww))  # [B*nW, wh*ww, C]

        coords = None  # hooks get each window's tokens' positions in the map (computed on demand)
        if (hp, wp) != (wh, ww):
            coords = lambda: _window_grid_coords((hp, wp), (wh, ww), (sh, sw), x.device)  # noqa: E731
        if self.kind == "softmax":
            mask = shift_window_mask((hp, wp), (wh, ww), (sh, sw), x.device) if (sh or sw) else None
            windows = self.attn(windows, (wh, ww), mask=mask, token_coords=coords)
        else:
            # residual context and 3x3 residual are per window (the mean of the window's tokens)
            windows = self.attn(windows, (wh, ww), token_coords=coords)

        x = window_reverse(windows, (wh, ww), (hp, wp))
        if sh or sw:
            x = torch.roll(x, shifts=(sh, sw), dims=(1, 2))
        if pad_b or pad_r:
            x = x[:, :h, :w].contiguous()
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, H, W, C] -> [B, H, W, C]."""
        x = x + self.drop_path(self._attention(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))

    def extra_repr(self) -> str:
        return f"kind={self.kind}, window_size={self.window_size}, shift_size={self.shift_size}"


class PatchMerging(nn.Module):
    """2x2 neighbourhood -> one token: [B, H, W, C] -> [B, ceil(H/2), ceil(W/2), 2C].

    Concatenation order (0,0), (1,0), (0,1), (1,1) as the reference; odd maps are zero-padded.
    """

    def __init__(self, dim: int):
        super().__init__()
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[1:3]
        if h % 2 or w % 2:
            x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)
        return self.reduction(self.norm(x))


class SwinStage(nn.Module):
    """Blocks at one resolution, then (except in the last stage) patch merging."""

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        *,
        kinds: Sequence[str],
        window_size: int,
        input_resolution: tuple[int, int],
        drop_path: Sequence[float],
        downsample: bool,
        **block_kw,
    ):
        super().__init__()
        blocks = []
        for j, kind in enumerate(kinds):
            if kind == "softmax":
                # Swin's window for the softmax blocks; as in the reference it shrinks to the
                # constructed map when that is smaller (this sizes the relative position table)
                win = min(softmax_window(window_size), min(input_resolution))
            else:
                win = window_size
            shift = win // 2 if j % 2 == 1 else 0
            blocks.append(
                SwinBlock(
                    dim,
                    num_heads,
                    kind=kind,
                    window_size=win,
                    shift_size=shift,
                    input_resolution=input_resolution,
                    drop_path=drop_path[j],
                    **block_kw,
                )
            )
        self.blocks = nn.ModuleList(blocks)
        self.downsample = PatchMerging(dim) if downsample else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, H, W, C] -> the stage's map after patch merging (when the stage has one)."""
        for blk in self.blocks:
            x = blk(x)
        return x if self.downsample is None else self.downsample(x)


# ---- checkpoints


def resize_rel_pos_table(table: torch.Tensor, rows: int) -> torch.Tensor:
    """[L, heads] -> [rows, heads]: each head's sqrt(L) x sqrt(L) table of relative-position biases
    (the (2w-1) x (2w-1) offsets of a square window w) resized bicubically, for another window."""
    old, new = math.isqrt(table.shape[0]), math.isqrt(rows)
    if old * old != table.shape[0] or new * new != rows:
        raise ValueError(
            f"a relative position table of {table.shape[0]} rows cannot be resized to {rows} rows "
            "(both must be square numbers)"
        )
    heads = table.shape[1]
    grid = table.t().reshape(1, heads, old, old).float()
    grid = F.interpolate(grid, size=(new, new), mode="bicubic", align_corners=False)
    return grid.reshape(heads, rows).t().to(table.dtype)


def checkpoint_filter_fn(state_dict: dict, model: "InLineSwin") -> dict:
    """Adapt an authors' (or our own) state dict to ``model``.

    - buffers the model recomputes (``relative_position_index``, ``attn_mask``) are taken from
      the model, so a checkpoint loads into a model built for another image size;
    - relative position tables of another window size are resized bicubically.
    Everything else passes through unchanged, for a strict load to check.
    """
    own = model.state_dict()
    out = {}
    for key, value in state_dict.items():
        if key.rsplit(".", 1)[-1] in RECOMPUTED_BUFFERS:
            continue
        if key.endswith("relative_position_bias_table") and key in own and own[key].shape != value.shape:
            value = resize_rel_pos_table(value, own[key].shape[0])
        out[key] = value
    for key, value in own.items():
        if key.rsplit(".", 1)[-1] in RECOMPUTED_BUFFERS:
            out[key] = value
    return out


# ---- model


class InLineSwin(InLineModel):
    """InLine-Swin (and, by ``pattern``, plain Swin or linear-attention Swin).

    Args:
        img_size: the constructed input size; only sizes the state dict's buffers (relative
            position tables of softmax blocks, the stored shift masks). Any input size runs.
        patch_size, in_chans, num_classes, embed_dim, depths, num_heads, mlp_ratio, qkv_bias: as Swin.
        window_size: window of the InLine / linear blocks; softmax blocks use :func:`softmax_window`.
        pattern: attention kind per stage (see :func:`parse_pattern`): "IIIS", "IIMS2", "SSSS", "LLLS".
        feature_map: phi of InLine / linear blocks (None = identity for InLine, relu for linear).
        local_residual: the 3x3 local residual (None = on for InLine blocks only).
        drop_rate: dropout after the patch embedding, in attention projections and MLPs (as the reference).
        attn_drop_rate: dropout on softmax weights. drop_path_rate: stochastic depth, linear in depth.
        global_pool: "avg" only (the token mean).
        impl: every attention layer's implementation, one of :data:`inline_attn.ops.IMPLS`
            (None = the process default, :func:`inline_attn.ops.use_impl`).

    The levels of :meth:`forward_intermediates` are the stages (strides 4, 8, 16, 32); a stage's
    map is taken before its patch merging.
    """

    no_weight_decay_patterns = ("relative_position_bias_table",)
    _map_fmt = "NHWC"
    dense_out_norms = True  # as Swin's detection / segmentation code

    def __init__(
        self,
        img_size: Union[int, tuple[int, int]] = 224,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 96,
        depths: Sequence[int] = (2, 2, 6, 2),
        num_heads: Sequence[int] = (3, 6, 12, 24),
        window_size: int = 56,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        pattern: str = "IIIS",
        feature_map: Optional[str] = None,
        local_residual: Optional[bool] = None,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.1,
        global_pool: str = "avg",
        impl: Optional[str] = None,
    ):
        super().__init__()
        if len(depths) != len(num_heads):
            raise ValueError(f"depths={tuple(depths)} and num_heads={tuple(num_heads)} must have the same length")
        if window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {window_size}")
        kinds = parse_pattern(pattern, depths)
        num_stages = len(depths)
        self.pattern, self.window_size = pattern, window_size
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_prefix_tokens = 0
        self.num_features = int(embed_dim * 2 ** (num_stages - 1))
        img_h, img_w = to_2tuple(img_size)
        p = to_2tuple(patch_size)

        # the patch conv zero-pads inputs its stride does not divide
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim, norm_layer=nn.LayerNorm)
        self.pos_drop = nn.Dropout(drop_rate)
        dpr = drop_path_rates(drop_path_rate, sum(depths))
        attention = dict(
            qkv_bias=qkv_bias, feature_map=feature_map, local_residual=local_residual, attn_drop=attn_drop_rate
        )
        res = (math.ceil(img_h / p[0]), math.ceil(img_w / p[1]))
        self.layers = nn.ModuleList()
        feature_info = []
        for i, (depth, heads) in enumerate(zip(depths, num_heads)):
            dim = int(embed_dim * 2**i)
            start = sum(depths[:i])
            self.layers.append(
                SwinStage(
                    dim,
                    depth,
                    heads,
                    kinds=kinds[i],
                    window_size=window_size,
                    input_resolution=res,
                    drop_path=dpr[start : start + depth],
                    downsample=i < num_stages - 1,
                    mlp_ratio=mlp_ratio,
                    drop=drop_rate,
                    **attention,
                )
            )
            feature_info.append(dict(num_chs=dim, reduction=p[0] * 2**i, module=f"layers.{i}"))
            res = (math.ceil(res[0] / 2), math.ceil(res[1] / 2))
        self.norm = nn.LayerNorm(self.num_features)
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        self.init_contract(feature_info)
        self.set_impl(impl)
        init_weights_(self)
        for m in self.modules():  # and the relative position tables, as the reference
            if isinstance(m, WindowAttention):
                trunc_normal_(m.relative_position_bias_table, std=0.02)

    def forward(self, x: torch.Tensor):
        """images [B, C_in, H, W] -> logits [B, num_classes] (a features_only model: its maps)."""
        return self._forward(x)  # a frame of this class's own for torch.compile (see InLineModel)

    # ---- the contract's hooks (state: an NHWC map)

    def _stem(self, x: torch.Tensor) -> torch.Tensor:
        """images [B, C_in, H, W] -> [B, H/4, W/4, C] (ceil)."""
        tokens, (h, w) = self.patch_embed(x)
        return self.pos_drop(tokens.view(tokens.shape[0], h, w, tokens.shape[-1]))

    def _run_level(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """The previous stage's patch merging (stored with that stage, as the reference), then
        stage i's blocks: [B, H, W, C] -> [B, H_i, W_i, C_i]."""
        if i > 0:
            x = self.layers[i - 1].downsample(x)
        for blk in self.layers[i].blocks:
            x = self.checkpointed(blk, x)
        return x

    def _level_map(self, i: int, x: torch.Tensor, norm: bool) -> torch.Tensor:
        return self.norm(x) if norm and i == self._built_levels - 1 else x  # the norm is the last stage's

    def _final(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """-> the normed final map [B, H/32, W/32, num_features] (NHWC)."""
        return self.norm(x) if i == self._built_levels - 1 else x

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(1, 2))  # the token mean

    def _level_modules(self, i: int) -> list[str]:
        # stage i's input comes from the previous stage's patch merging
        return [f"layers.{i}"] + ([f"layers.{i - 1}.downsample"] if i > 0 else [])

    def _stem_modules(self) -> list[str]:
        return ["patch_embed"]


InLineSwin.checkpoint_filter_fn = staticmethod(checkpoint_filter_fn)


# ---- registered variants

_REFERENCE = "LeapLabTHU/InLine models/inline_swin.py:InLineSwin"
_TINY = dict(
    embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=56, pattern="IIIS", drop_path_rate=0.2
)
_SMALL = dict(_TINY, depths=(2, 2, 18, 2), pattern="IISS", drop_path_rate=0.3)
_BASE = dict(_SMALL, embed_dim=128, num_heads=(4, 8, 16, 32), pattern="IIMS2", drop_path_rate=0.5)
_BASE384 = dict(_BASE, img_size=384, window_size=96)  # softmax window 12

_FAMILY = Family(
    InLineSwin,
    "swin",
    reference=_REFERENCE,
    first_conv="patch_embed.proj",
    recorded=("pattern", "window_size", "drop_path_rate"),
)
# size, title, defaults, then the paper's top-1 (%), parameters and GMACs
inline_swin_tiny = _FAMILY.variant("tiny", "InLine-Swin-T", _TINY, 82.4, 29_223_544, 4.46)
inline_swin_small = _FAMILY.variant("small", "InLine-Swin-S", _SMALL, 83.6, 49_793_296, 8.72)
inline_swin_base = _FAMILY.variant("base", "InLine-Swin-B", _BASE, 84.1, 88_350_120, 15.40)
inline_swin_base_384 = _FAMILY.variant(
    "base_384", "InLine-Swin-B (384)", _BASE384, None, 88_465_320, None, crop_pct=1.0
)
