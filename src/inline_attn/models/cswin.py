"""InLine-CSwin: CSWin Transformer with InLine attention in its first stages (paper Sec. 5.1).

Layout (state-dict names as the authors' ``models/inline_cswin.py``):

- ``stage1_conv_embed``: 7x7 stride-4 conv, flatten to tokens, LayerNorm (indices 0, 1, 2).
- four stages ``stage1..stage4`` of :class:`CSwinBlock`; between them ``merge1..merge3``
  (3x3 stride-2 conv + LayerNorm, channels doubled).
- ``norm`` then ``head`` on the token mean.

A block projects ``qkv`` once, splits the channels into two halves and runs two branches
(``attns.0``: vertical stripes of width ``split``, ``attns.1``: horizontal stripes of height
``split``), then one ``proj``. A block has a single full-width branch over the whole map in the
last stage or when its split covers the stage's map at ``img_size``; with the published InLine
splits (56-28-14-7 at 224) every InLine block is global. Each branch adds LePE (a depthwise
3x3 conv ``get_v`` on V, per stripe) to its attention output, whatever its attention kind;
InLine branches also add the predicted local residual, whose context is the mean of the
*block* input before ``norm1``, split in channel halves like the branches (a quirk of the
reference code; the other families take the mean of the attention input).

Any input size: the block structure is fixed at construction (from ``img_size``), but the
stripes are laid over the actual map. A global block stays global at every size. A stripe
wider than the map is clamped to the map; when the split does not divide the map, the last
stripe is narrower (the remainder), and every kind (softmax, linear, InLine) attends over
exactly the tokens of its stripe.

Each branch runs its stripes for all samples and heads as one batch of windows (samples x
stripes), so the attention core runs once per branch. A remainder stripe joins that call for
InLine with the identity feature map (the published models): it is padded to the full width in a
way that leaves InLine's output and gradients exact (:meth:`StripeAttention._attend_padded`).
Softmax, linear and the other kinds, and any branch while an attention hook is installed, call the
core twice instead (full stripes, then the remainder stripe), so a recorder gets two records.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence, Union

import torch
import torch.nn as nn

from ..layers import (
    drop_path_rates,
    BlockOptions,
    DropPath,
    LocalResidual,
    Mlp,
    RecordableAttention,
    check_heads,
    check_images,
    init_weights_,
    LINEAR_CORES,
    check_kind,
    make_core,
    make_feature_map,
    pad_small_input,
    to_2tuple,
    tokens_to_nchw,
    uses_local_residual,
)
from ._base import InLineModel
from ._helpers import parse_pattern
from .registry import Family

__all__ = ["NUM_STAGES", "CSwinBlock", "InLineCSwin", "MergeBlock", "StripeAttention"]

NUM_STAGES = 4  # CSwin's fixed layout: four stages at strides 4, 8, 16, 32 (the last one global)


def _split_sizes(value: Union[str, int, Sequence[int]], name: str, num_stages: int) -> tuple[int, ...]:
    """'56-28-14-7' (the reference's string form), an int, or a sequence -> one int per stage."""
    if isinstance(value, str):
        try:
            value = [int(s) for s in value.split("-")]
        except ValueError:
            raise ValueError(f"{name}={value!r}: expected integers joined by '-', like '56-28-14-7'") from None
    elif isinstance(value, int):
        value = [value] * num_stages
    value = tuple(int(v) for v in value)
    if len(value) != num_stages or min(value) < 1:
        raise ValueError(f"{name}={value!r}: expected {num_stages} positive sizes, one per stage")
    return value


def _stripe_regions(size: int, stripe: int) -> list[tuple[int, int, int]]:
    """Cover ``[0, size)`` with stripes of width ``stripe``: [(start, end, stripe width)].

    One region of full stripes and, when ``stripe`` does not divide ``size``, one narrower
    remainder stripe. A stripe wider than ``size`` is clamped to ``size``.
    """
    stripe = min(stripe, size)
    full = size - size % stripe
    regions = [(0, full, stripe)]
    if full < size:
        regions.append((full, size, size - full))
    return regions


def _window_coords(r0: int, c0: int, h: int, w: int, sh: int, sw: int, device) -> torch.Tensor:
    """(row, col) in the stage map of every token of the sh x sw windows tiling an h x w region
    at (r0, c0): [G, sh*sw, 2] long, windows row-major, tokens row-major."""
    rows = torch.arange(h, device=device).view(h // sh, 1, sh, 1).expand(h // sh, w // sw, sh, sw) + r0
    cols = torch.arange(w, device=device).view(1, w // sw, 1, sw).expand(h // sh, w // sw, sh, sw) + c0
    return torch.stack([rows, cols], dim=-1).reshape(-1, sh * sw, 2)


def _scale_last_window(t: torch.Tensor, b: int, factor: float) -> torch.Tensor:
    """t: [B*G, ...] per-window tensors (windows batch-major) with each sample's last window times
    ``factor``."""
    t = t.view(b, -1, *t.shape[1:])
    return torch.cat([t[:, :-1], t[:, -1:] * factor], dim=1).flatten(0, 1)


class StripeAttention(RecordableAttention):
    """One CSwin attention branch: attention within stripes (or the whole map) plus LePE.

    Args:
        dim: channels C of this branch (half the block's channels for stripe branches).
        num_heads: heads h of this branch.
        mode: "global" (the whole map), "vertical" (stripes of ``split_size`` columns, full
            height; the reference's idx 0) or "horizontal" (``split_size`` rows, full width; idx 1).
        split_size: stripe width in tokens (ignored for "global").
        kind: "inline", "linear", "softmax" or another linear attention (see TokenAttention).
        feature_map: phi for inline / linear (default identity / relu).
        local_residual: add InLine's predicted 3x3 residual on V (default: on for InLine only).
        attn_drop: dropout on softmax weights.
        impl: as :class:`~inline_attn.layers.TokenAttention`'s.

    State-dict names: ``get_v`` (LePE), ``residual.0`` / ``residual.2`` (as the reference).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        mode: str = "global",
        split_size: int = 7,
        kind: str = "inline",
        feature_map: Optional[str] = None,
        local_residual: Optional[bool] = None,
        attn_drop: float = 0.0,
        impl: Optional[str] = None,
    ):
        super().__init__(impl)
        if mode not in ("global", "vertical", "horizontal"):
            raise ValueError(f"unknown stripe mode {mode!r}: expected global, vertical or horizontal")
        if split_size < 1:
            raise ValueError(f"split_size must be a positive stripe width, got {split_size}")
        check_kind(kind, feature_map)
        self.head_dim = check_heads(dim, num_heads)
        self.dim, self.num_heads, self.mode, self.split_size, self.kind = dim, num_heads, mode, split_size, kind
        self.scale = self.head_dim**-0.5
        self.feature_map = make_feature_map(feature_map, self.head_dim) if kind != "softmax" else None
        self.core = make_core(kind, dim, num_heads) if kind in LINEAR_CORES else None
        self.get_v = nn.Conv2d(dim, dim, kernel_size=3, padding=1, groups=dim)
        self.attn_drop = nn.Dropout(attn_drop)
        self.residual = LocalResidual(dim, num_heads) if uses_local_residual(kind, local_residual) else None

    def _regions(self, h: int, w: int) -> list[tuple[int, int, int, int, int, int]]:
        """Rectangles tiled by equal windows: [(r0, c0, rows, cols, window rows, window cols)]."""
        if self.mode == "global":
            return [(0, 0, h, w, h, w)]
        if self.mode == "vertical":
            return [(0, c0, h, c1 - c0, h, sw) for c0, c1, sw in _stripe_regions(w, self.split_size)]
        return [(r0, 0, r1 - r0, w, sh, w) for r0, r1, sh in _stripe_regions(h, self.split_size)]

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        feat_size: tuple[int, int],
        context: torch.Tensor,
    ) -> torch.Tensor:
        """q, k, v: [B, H*W, C] (row-major grid ``feat_size``); context: [B, C] -> [B, H*W, C]."""
        b, n, c = q.shape
        h, w = feat_size
        if n != h * w or c != self.dim:
            raise ValueError(f"expected q, k, v of shape [B, {h}*{w}, {self.dim}], got {tuple(q.shape)}")
        q, k, v = (t.reshape(b, h, w, c) for t in (q, k, v))
        res_weights = self.residual.predict(context).to(v.dtype) if self.residual is not None else None
        regions = self._regions(h, w)
        if len(regions) > 1 and self._pads_remainder():
            return self._attend_padded(q, k, v, res_weights).reshape(b, n, c)
        outs = []
        for r0, c0, rh, rw, sh, sw in regions:
            sl = (slice(None), slice(r0, r0 + rh), slice(c0, c0 + rw))
            outs.append(self._attend_windows(q[sl], k[sl], v[sl], (r0, c0), (sh, sw), res_weights))
        if len(outs) == 1:
            out = outs[0]
        else:  # vertical regions join along W, horizontal along H
            out = torch.cat(outs, dim=2 if self.mode == "vertical" else 1)
        return out.reshape(b, n, c)

    def _pads_remainder(self) -> bool:
        """Whether a remainder stripe joins the full stripes in one core call (zero-padded, see
        :meth:`_attend_padded`): InLine with the identity feature map, no hook (a hook records each
        stripe width apart)."""
        return self.kind == "inline" and self.feature_map in (None, "identity") and not self.hooked

    def _attend_padded(self, q, k, v, res_weights):
        """q, k, v: [B, h, w, C] whose last stripe is narrower (r of s tokens) -> [B, h, w, C], with
        every stripe in one call of the core: the last stripe is padded to the full width.

        The padding is exact for InLine: padded keys equal the stripe's mean key (so k_bar and the
        centred keys are unchanged) and padded values are zero, with the stripe's real values
        scaled by N'/N = s/r (so that M = scale/N' sum_j (k_j - k_bar) v_j^T and v_bar are the
        unpadded stripe's) and its residual weights by r/s (the residual is linear in V; the zero
        padding is the window border it sees unpadded). LePE reads the unscaled values."""
        dim = 2 if self.mode == "vertical" else 1
        size = q.shape[dim]
        full = min(self.split_size, size)
        width = size % full  # the last stripe's (r), 0 < r < s
        pad = list(q.shape)
        pad[dim] = full - width
        k_fill = k.narrow(dim, size - width, width).mean(dim=(1, 2), keepdim=True).expand(pad)
        q, k, v = (
            torch.cat([t, fill], dim=dim) for t, fill in ((q, q.new_zeros(pad)), (k, k_fill), (v, v.new_zeros(pad)))
        )
        window = (q.shape[1], full) if dim == 2 else (full, q.shape[2])
        out = self._attend_windows(q, k, v, (0, 0), window, res_weights, last_scale=full / width)
        return out.narrow(dim, 0, out.shape[dim] - pad[dim])

    def _attend_windows(self, q, k, v, origin, window, res_weights, last_scale=None):
        """q, k, v: [B, h, w, C] region tiled by windows (sh, sw) -> [B, h, w, C]."""
        b, h, w, c = q.shape
        sh, sw = window
        gh, gw = h // sh, w // sw
        g, nt = gh * gw, sh * sw

        def to_windows(t):  # [B, h, w, C] -> [B*G, sh*sw, C], windows batch-major, row-major
            return t.reshape(b, gh, sh, gw, sw, c).permute(0, 1, 3, 2, 4, 5).reshape(b * g, nt, c)

        qw, kw, vw = to_windows(q), to_windows(k), to_windows(v)
        # the residual's weights are per sample; each window is convolved with zero padding
        win_weights = res_weights.repeat_interleave(g, dim=0) if res_weights is not None else None
        v_core = vw
        if last_scale is not None:  # the padded last stripe (see _attend_padded): values up, weights down
            v_core = _scale_last_window(vw, b, last_scale)
            if win_weights is not None:
                win_weights = _scale_last_window(win_weights, b, 1 / last_scale)
        coords = None if self.mode == "global" else (lambda: _window_coords(*origin, h, w, sh, sw, q.device))
        out = self.attend_tokens(
            qw,
            kw,
            v_core,
            feat_size=(sh, sw),
            residual_weights=win_weights,
            feature_map=self.feature_map,
            scale=self.scale,
            token_coords=coords,
            attn_drop=self.attn_drop,
        )
        v_img = vw.transpose(1, 2).reshape(b * g, c, sh, sw)  # each window as its own image
        out = out + self.get_v(v_img).flatten(2).transpose(1, 2)  # LePE, also per window
        return out.view(b, gh, gw, sh, sw, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)

    def extra_repr(self) -> str:
        split = "" if self.mode == "global" else f", split_size={self.split_size}"
        return f"kind={self.kind}, dim={self.dim}, num_heads={self.num_heads}, mode={self.mode}{split}"


class CSwinBlock(nn.Module):
    """Pre-norm block: fused qkv -> one or two stripe branches -> proj; then an MLP.

    Args:
        dim: channels C.
        num_heads: heads of the block (each of two branches gets half of them, on C/2 channels).
        kind: attention kind of the branches.
        split_size: stripe width of the two branches.
        global_attn: one full-width branch over the whole map instead of two stripe branches.
        options: :class:`~inline_attn.layers.BlockOptions` (mlp_ratio, qkv_bias, feature_map, ...;
            softmax blocks ignore feature_map and local_residual, as the base CSwin has neither).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        kind: str = "inline",
        split_size: int = 7,
        global_attn: bool = False,
        **options,
    ):
        super().__init__()
        o = BlockOptions(**options)
        self.dim, self.kind = dim, kind
        self.qkv = nn.Linear(dim, dim * 3, bias=o.qkv_bias)
        self.norm1 = o.norm_layer(dim)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(o.drop)
        if kind == "softmax":  # softmax blocks are the base CSwin: no feature map, no local residual
            o = replace(o, feature_map=None, local_residual=False)
        branch = dict(kind=kind, feature_map=o.feature_map, local_residual=o.local_residual, attn_drop=o.attn_drop)
        if global_attn:
            self.attns = nn.ModuleList([StripeAttention(dim, num_heads, mode="global", **branch)])
        else:
            if dim % 2 or num_heads < 2:
                raise ValueError(
                    f"a two-branch block needs an even dim and at least 2 heads, got dim={dim}, num_heads={num_heads}"
                )
            self.attns = nn.ModuleList(
                [
                    StripeAttention(dim // 2, num_heads // 2, mode=mode, split_size=split_size, **branch)
                    for mode in ("vertical", "horizontal")
                ]
            )
        self.drop_path = DropPath(o.drop_path)
        self.mlp = Mlp(dim, int(dim * o.mlp_ratio), drop=o.drop)
        self.norm2 = o.norm_layer(dim)

    def forward(self, x: torch.Tensor, feat_size: tuple[int, int]) -> torch.Tensor:
        """x: [B, H*W, C] -> [B, H*W, C]."""
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x))
        context = x.mean(dim=1)  # the block input before norm1 (reference quirk)
        if len(self.attns) == 1:
            out = self.attns[0](*qkv.view(b, n, 3, c).unbind(2), feat_size, context)
        else:
            # each branch takes a channel half of q, k, v and the context, as views from unbind and
            # chunk, whose backward is one stack / cat (slicing took a zero-filled copy per slice)
            halves = qkv.view(b, n, 3, 2, c // 2).unbind(3)
            out = torch.cat(
                [
                    attn(*qkv_half.unbind(2), feat_size, ctx_half)
                    for attn, qkv_half, ctx_half in zip(self.attns, halves, context.chunk(2, dim=1))
                ],
                dim=2,
            )
        x = x + self.drop_path(self.proj_drop(self.proj(out)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class MergeBlock(nn.Module):
    """3x3 stride-2 conv + LayerNorm between stages: [B, H*W, C] -> [B, ceil(H/2)*ceil(W/2), C']."""

    def __init__(self, dim: int, dim_out: int):
        super().__init__()
        self.conv = nn.Conv2d(dim, dim_out, kernel_size=3, stride=2, padding=1)
        self.norm = nn.LayerNorm(dim_out)

    def forward(self, x: torch.Tensor, feat_size: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
        b, n, c = x.shape
        x = self.conv(x.transpose(1, 2).reshape(b, c, *feat_size))
        return self.norm(x.flatten(2).transpose(1, 2)), (x.shape[2], x.shape[3])


class _ToTokens(nn.Module):
    """[B, C, H, W] -> [B, H*W, C] (the stem's parameter-free middle step)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(2).transpose(1, 2)


class InLineCSwin(InLineModel):
    """CSwin Transformer with per-stage attention kinds (InLine / softmax / linear).

    Args:
        img_size: the design input size (int or (H, W)); it decides which blocks are global
            (split >= the stage's map), as in the reference. Other input sizes still work.
        in_chans, num_classes: input channels, classes (0 = no head).
        embed_dim: stage-1 channels (doubled per stage).
        depths, num_heads: blocks and heads per stage (:data:`NUM_STAGES` stages).
        split_size: stripe width of softmax blocks per stage (reference ``split_size``).
        inline_split_size: stripe width of InLine and linear blocks per stage (reference
            ``la_split_size``; "56-28-14-7" or a sequence).
        pattern: paper letters per stage (I, S, L; M<n> mixed), see ``_helpers.parse_pattern``.
        feature_map: phi of InLine / linear blocks (None = identity / relu); softmax blocks ignore it.
        local_residual: the local residual of InLine / linear blocks (None = on for InLine
            blocks only); softmax blocks never have one.
        mlp_ratio, qkv_bias, drop_rate, attn_drop_rate, drop_path_rate: as in timm.
        global_pool: "avg" only (the token mean).
        impl: every attention layer's implementation, one of :data:`inline_attn.ops.IMPLS`
            (None = the process default, :func:`inline_attn.ops.use_impl`).

    The levels of :meth:`forward_intermediates` are the stages (strides 4, 8, 16, 32).
    """

    dense_out_norms = True  # as CSwin's detection / segmentation code

    def __init__(
        self,
        img_size: Union[int, tuple[int, int]] = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 64,
        depths: Sequence[int] = (2, 4, 18, 1),
        num_heads: Sequence[int] = (2, 4, 8, 16),
        split_size: Union[str, int, Sequence[int]] = (1, 2, 7, 7),
        inline_split_size: Union[str, int, Sequence[int]] = (56, 28, 14, 7),
        pattern: str = "IISS",
        feature_map: Optional[str] = None,
        local_residual: Optional[bool] = None,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        global_pool: str = "avg",
        impl: Optional[str] = None,
    ):
        super().__init__()
        if len(depths) != NUM_STAGES or len(num_heads) != NUM_STAGES:
            raise ValueError(f"CSwin has {NUM_STAGES} stages: got depths={depths}, num_heads={num_heads}")
        img_h, img_w = to_2tuple(img_size)
        split_size = _split_sizes(split_size, "split_size", NUM_STAGES)
        inline_split_size = _split_sizes(inline_split_size, "inline_split_size", NUM_STAGES)
        kinds = parse_pattern(pattern, depths)
        self.pattern, self.num_classes, self.global_pool = pattern, num_classes, global_pool
        self.num_prefix_tokens = 0
        dims = [embed_dim * 2**i for i in range(NUM_STAGES)]
        self.num_features = dims[-1]

        self.stage1_conv_embed = nn.Sequential(
            nn.Conv2d(in_chans, embed_dim, kernel_size=7, stride=4, padding=2),
            _ToTokens(),
            nn.LayerNorm(embed_dim),
        )
        dpr = drop_path_rates(drop_path_rate, sum(depths))
        feature_info = []
        attention = dict(
            qkv_bias=qkv_bias, feature_map=feature_map, local_residual=local_residual, attn_drop=attn_drop_rate
        )
        for i in range(NUM_STAGES):
            if i > 0:
                self.add_module(f"merge{i}", MergeBlock(dims[i - 1], dims[i]))
            reso = max(img_h, img_w) // (4 * 2**i)
            blocks = []
            for j, kind in enumerate(kinds[i]):
                split = split_size[i] if kind == "softmax" else inline_split_size[i]
                blocks.append(
                    CSwinBlock(
                        dims[i],
                        num_heads[i],
                        kind=kind,
                        split_size=split,
                        global_attn=(i == NUM_STAGES - 1 or split >= reso),
                        mlp_ratio=mlp_ratio,
                        drop=drop_rate,
                        drop_path=dpr[sum(depths[:i]) + j],
                        **attention,
                    )
                )
            self.add_module(f"stage{i + 1}", nn.ModuleList(blocks))
            feature_info.append(dict(num_chs=dims[i], reduction=4 * 2**i, module=f"stage{i + 1}"))
        self.norm = nn.LayerNorm(self.num_features)
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.init_contract(feature_info)
        self.set_impl(impl)
        init_weights_(self)

    def forward(self, x: torch.Tensor):
        """images [B, C_in, H, W] -> logits [B, num_classes] (a features_only model: its maps)."""
        return self._forward(x)  # a frame of this class's own for torch.compile (see InLineModel)

    # ---- the contract's hooks (state: tokens [B, H*W, C] and the grid (H, W))

    def _stem(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        stem = self.stage1_conv_embed[0]
        check_images(x, stem.in_channels, stem.weight)
        x = pad_small_input(x, stem.stride, type(self).__name__)
        x = stem(x)
        feat_size = (x.shape[2], x.shape[3])
        return self.stage1_conv_embed[2](self.stage1_conv_embed[1](x)), feat_size

    def _run_level(self, i: int, state):
        x, feat_size = state
        if i > 0:
            x, feat_size = getattr(self, f"merge{i}")(x, feat_size)
        for blk in getattr(self, f"stage{i + 1}"):
            x = self.checkpointed(blk, x, feat_size)
        return x, feat_size

    def _level_map(self, i: int, state, norm: bool) -> torch.Tensor:
        x, feat_size = state
        if norm and i == self._built_levels - 1:  # the final norm belongs to the last stage
            x = self.norm(x)
        return tokens_to_nchw(x, feat_size)

    def _final(self, state, i: int) -> torch.Tensor:
        """-> the final tokens after ``norm``: [B, H/32 * W/32, C]."""
        return self.norm(state[0]) if i == self._built_levels - 1 else state[0]

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        return self.head_drop(x.mean(dim=1))

    def _level_modules(self, i: int) -> list[str]:
        return [f"stage{i + 1}"] + ([f"merge{i}"] if i > 0 else [])

    def _stem_modules(self) -> list[str]:
        return ["stage1_conv_embed"]


# ---- registered variants

_REFERENCE = "LeapLabTHU/InLine models/inline_cswin.py:CSWinTransformer"
# Drop path: the authors' InLine-CSwin code does not state it; these are the rates of their
# Agent-Attention CSwin configs (T 0.2, S 0.4, B 0.5, B-384 0.7), which share the training recipe.
_TINY = dict(
    embed_dim=64,
    depths=(2, 4, 18, 1),
    num_heads=(2, 4, 8, 16),
    split_size=(1, 2, 7, 7),
    inline_split_size=(56, 28, 14, 7),
    pattern="IISS",
    drop_path_rate=0.2,
)
_SMALL = dict(_TINY, depths=(3, 6, 29, 2), drop_path_rate=0.4)
_BASE = dict(_SMALL, embed_dim=96, num_heads=(4, 8, 16, 32), drop_path_rate=0.5)
_BASE384 = dict(_BASE, img_size=384, split_size=(1, 2, 12, 12), inline_split_size=(96, 48, 24, 12), drop_path_rate=0.7)

_FAMILY = Family(
    InLineCSwin,
    "cswin",
    reference=_REFERENCE,
    first_conv="stage1_conv_embed.0",
    recorded=("pattern", "split_size", "inline_split_size", "drop_path_rate"),
    crop_pct=0.9,
)
# size, title, defaults, then the paper's top-1 (%), parameters and GMACs
inline_cswin_tiny = _FAMILY.variant("tiny", "InLine-CSwin-T (224)", _TINY, 83.2, 20_604_520, 4.31)
inline_cswin_small = _FAMILY.variant("small", "InLine-CSwin-S (224)", _SMALL, 83.8, 33_032_872, 6.77)
inline_cswin_base = _FAMILY.variant("base", "InLine-CSwin-B (224)", _BASE, 84.5, 73_413_640, 14.88)
inline_cswin_base_384 = _FAMILY.variant(
    "base_384", "InLine-CSwin-B (384)", _BASE384, 85.7, 73_413_640, 46.3, crop_pct=1.0
)
