"""Put InLine into an existing model: :func:`convert` replaces its attention modules in place.

Recognised modules (by their structure: neither timm nor torchvision is imported):

- timm's ``Attention`` (ViT, DeiT, and EVA-style layouts with ``q_proj`` / ``k_proj`` / ``v_proj``;
  called ``attn(x, attn_mask=None, is_causal=False)``) -> :class:`InLineTimmAttention`;
- timm's ``EvaAttention`` in a model without rotary embeddings (EVA-01 style; called
  ``attn(x, rope=None, attn_mask=None, is_causal=False)``) -> :class:`InLineEvaAttention`; a model
  with a ``rope`` module is refused;
- timm Swin's ``WindowAttention`` (``attn(x_windows, mask=None)``) -> :class:`InLineWindowAttention`;
  the window is the grid, and the shift mask is not applied (as the reference InLine-Swin blocks);
  the relative position bias table is dropped;
- any ``nn.MultiheadAttention`` (torchvision's ViT encoder among them; batch_first or not) ->
  :class:`InLineMultiheadAttention`, called the same way and returning ``(out, None)``; the local
  residual in self-attention only (``mha(x, x, x)``), never in cross-attention.

The replacement is called exactly as the module it replaces. Projections (q, k, v and the output)
are copied bit for bit. The local residual (paper Sec. 4.2) needs the token grid: it comes from the
model's patch convolution (``patch_embed.proj`` in timm, ``conv_proj`` in torchvision; a forward
hook records each input's grid, so it follows the input size; the tokens before the grid are the
prefix tokens), from the window (Swin), or from a square token count after ``num_prefix_tokens``.
Its predictor's last layer starts at zero, so the residual starts as a no-op and fine-tuning starts
from the network as it was, with the softmax replaced by its first-order expansion. Padded tokens
(a key-padding mask) are not on the grid: they feed neither the predictor's token mean nor the
3x3 convolution (which sees zeros in their place).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn

from ..layers.common import check_flag
from ..layers.local_residual import LocalResidual
from ..ops import check_count, inline_attention, linear_attention
from ..ops.eager import autocast_dtype
from ..ops.tokens import add_to_grid_tokens, grid_residual

CONVERT_KINDS = ("inline", "linear")


class TokenGrid:
    """The token grid of the model's current input: set by a forward hook on its patch convolution
    (:meth:`follow`), or a fixed (H, W) (a window), or the square count after ``num_prefix_tokens``."""

    def __init__(self, fixed: Optional[tuple[int, int]] = None, num_prefix_tokens: Optional[int] = None):
        self.current = fixed
        self.num_prefix_tokens = num_prefix_tokens

    def follow(self, conv: nn.Module) -> None:
        def record(_module, _inputs, output):
            self.current = (int(output.shape[-2]), int(output.shape[-1]))

        conv.register_forward_hook(record)

    def locate(self, n: int) -> tuple[tuple[int, int], int]:
        """(grid (H, W), prefix token count) for n tokens."""
        if self.current is None:
            p = self.num_prefix_tokens or 0
            side = math.isqrt(max(n - p, 0))
            if side * side != n - p or side == 0:
                raise ValueError(f"{n} tokens after {p} prefix tokens are not a square grid: pass num_prefix_tokens")
            return (side, side), p
        h, w = self.current
        if n < h * w:
            raise ValueError(f"{n} tokens cannot hold the model's {h}x{w} patch grid")
        return (h, w), n - h * w


def _zero_last_layer(residual: LocalResidual) -> LocalResidual:
    last = residual[2]
    nn.init.zeros_(last.weight)
    nn.init.zeros_(last.bias)
    return residual


class _Converted(nn.Module):
    """What the replacements share: the attention kind, the grid and the local residual."""

    def __init__(self, kind: str, dim: int, num_heads: int, grid: Optional[TokenGrid], scale: float, context: int):
        """dim: the attention's channels (V's); context: the input's (the residual needs both equal)."""
        super().__init__()
        self.kind, self.num_heads, self.scale = kind, num_heads, scale
        self.grid = grid
        with_residual = grid is not None and context == dim
        self.residual = _zero_last_layer(LocalResidual(dim, num_heads)) if with_residual else None

    def attend(self, x, q, k, v, key_padding_mask=None, is_causal=False, self_attention=True):
        """x: [B, N, C] the layer input (the residual's context); q, k, v: [B, h, N, d] -> [B, N, C].

        The residual is added only where ``self_attention`` (the query tokens are the key and value
        tokens, so V lies on the query's grid) and not ``is_causal`` (its 3x3 neighbours would
        include later tokens). Padded tokens (``key_padding_mask`` True) are not on the grid: they
        are left out of the predictor's token mean, and the 3x3 convolution sees zeros in their
        place, as beyond the grid's border.
        """
        if self.kind == "inline":
            out = inline_attention(q, k, v, key_padding_mask=key_padding_mask, is_causal=is_causal, scale=self.scale)
        else:
            out = linear_attention(q, k, v, key_padding_mask=key_padding_mask, is_causal=is_causal)
        b, h, n, d = out.shape
        out = out.transpose(1, 2).reshape(b, n, h * d)
        if self.residual is None or is_causal or not self_attention:
            return out
        grid, prefix = self.grid.locate(n)
        v_tokens = v.transpose(1, 2).reshape(b, n, h * d)
        if key_padding_mask is None:
            context = x.mean(dim=1)
        else:
            padded = key_padding_mask.unsqueeze(-1)  # [B, N, 1]
            valid = (~padded).sum(dim=1)  # [B, 1]; a sample with no valid token gets a zero context
            context = x.masked_fill(padded, 0).sum(dim=1) / valid.clamp(min=1)
            v_tokens = v_tokens.masked_fill(padded, 0)
        weights = self.residual.predict(context)
        return add_to_grid_tokens(out, grid_residual(v_tokens, weights, grid, prefix).to(out.dtype), prefix)


class InLineTimmAttention(_Converted):
    """Replaces timm's ``Attention``: ``forward(x, attn_mask=None, is_causal=False) -> [B, N, C]``,
    with its attribute names (qkv or q_proj / k_proj / v_proj, q_norm, k_norm, norm, proj, ...).
    ``attn_mask`` must be None: InLine's linear form has no per-pair masks."""

    def __init__(self, old: nn.Module, kind: str, grid: Optional[TokenGrid]):
        head_dim = old.head_dim
        projection = old.qkv if getattr(old, "qkv", None) is not None else old.q_proj
        scale = getattr(old, "scale", head_dim**-0.5)
        super().__init__(kind, head_dim * old.num_heads, old.num_heads, grid, scale, projection.in_features)
        self.head_dim, self.attn_dim = head_dim, head_dim * old.num_heads
        for name in ("qkv", "q_proj", "k_proj", "v_proj", "proj"):  # the projections: the same modules
            setattr(self, name, getattr(old, name, None))
        for name in ("q_norm", "k_norm", "attn_drop", "norm", "proj_drop"):  # optional in older timm
            setattr(self, name, getattr(old, name, None) or nn.Identity())

    def _packed_qkv(self, x: torch.Tensor) -> torch.Tensor:
        return self.qkv(x)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [B, N, C] -> q, k, v: [B, h, N, d], after q_norm / k_norm (as timm)."""
        b, n, _ = x.shape
        if self.qkv is not None:
            qkv = self._packed_qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        else:
            q, k, v = (
                p(x).reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)
                for p in (self.q_proj, self.k_proj, self.v_proj)
            )
        return self.q_norm(q), self.k_norm(k), v

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False):
        q, k, v = self.heads(x)
        _no_pair_mask(attn_mask)
        out = self.attend(x, q, k, v, is_causal=is_causal)
        return self.proj_drop(self.proj(self.norm(out)))


class InLineEvaAttention(InLineTimmAttention):
    """Replaces timm's ``EvaAttention`` in a model without rotary embeddings (EVA-01 style):
    ``forward(x, rope=None, attn_mask=None, is_causal=False) -> [B, N, C]``, with its attribute names
    (qkv with the ``q_bias`` / ``v_bias`` parameters and the zero ``k_bias`` buffer, or q_proj /
    k_proj / v_proj; q_norm, k_norm, the sub-LN ``norm`` before ``proj``, ``gate``). ``rope`` must
    be None: InLine's linear form here has no rotary version."""

    def __init__(self, old: nn.Module, kind: str, grid: Optional[TokenGrid]):
        super().__init__(old, kind, grid)
        self.q_bias, self.v_bias = old.q_bias, old.v_bias  # Parameters (or None): the same tensors
        self.register_buffer("k_bias", old.k_bias, persistent=False)  # zeros, not in the state dict
        self.qkv_bias_separate = getattr(old, "qkv_bias_separate", False)
        self.gate = getattr(old, "gate", None)
        self.num_prefix_tokens = getattr(old, "num_prefix_tokens", None)

    def _packed_qkv(self, x: torch.Tensor) -> torch.Tensor:
        if self.q_bias is None:
            return self.qkv(x)
        bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))  # K has no bias: timm's zero buffer
        if self.qkv_bias_separate:
            return self.qkv(x) + bias
        return nn.functional.linear(x, self.qkv.weight, bias)

    def forward(
        self,
        x: torch.Tensor,
        rope: Optional[torch.Tensor] = None,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
    ):
        if rope is not None:
            raise ValueError(
                f"a converted EvaAttention was called with rotary embeddings (rope of shape {tuple(rope.shape)}): "
                "InLine's linear form here has no rotary version; convert only EVA models without rope"
            )
        q, k, v = self.heads(x)
        _no_pair_mask(attn_mask)
        out = self.norm(self.attend(x, q, k, v, is_causal=is_causal))
        if self.gate is not None:
            out = out * self.gate(x).sigmoid()
        return self.proj_drop(self.proj(out))


class InLineWindowAttention(_Converted):
    """Replaces timm Swin's ``WindowAttention``: ``forward(x, mask=None)`` on [B * windows, Wh * Ww, C];
    the shift mask is accepted and not applied (the reference InLine-Swin blocks)."""

    def __init__(self, old: nn.Module, kind: str, residual: bool):
        ws = (old.window_size, old.window_size) if isinstance(old.window_size, int) else tuple(old.window_size)
        dim, attn_dim = old.qkv.in_features, old.qkv.out_features // 3
        grid = TokenGrid(fixed=ws) if residual else None
        super().__init__(kind, attn_dim, old.num_heads, grid, old.scale, dim)
        self.dim, self.window_size, self.window_area = dim, ws, ws[0] * ws[1]
        self.head_dim = attn_dim // old.num_heads
        self.qkv, self.attn_drop, self.proj, self.proj_drop = old.qkv, old.attn_drop, old.proj, old.proj_drop

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        return self.proj_drop(self.proj(self.attend(x, q, k, v)))


def _no_pair_mask(attn_mask) -> None:
    if attn_mask is not None:
        raise ValueError(
            f"a converted InLine attention takes no attn_mask (got {attn_mask.dtype} {tuple(attn_mask.shape)}): "
            "InLine's linear form has no per-pair masks; use a key-padding mask or is_causal"
        )


class InLineMultiheadAttention(_Converted):
    """Replaces ``nn.MultiheadAttention``, with its parameter names (``in_proj_weight`` or
    ``q_proj_weight`` / ``k_proj_weight`` / ``v_proj_weight``, ``in_proj_bias``, ``out_proj``):
    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False) -> (out, None)``, batched ([N, L, E] with
    ``batch_first``, else [L, N, E]) or unbatched ([L, E], with a [S] key_padding_mask; the output
    unbatched too), as torch's. No weights are formed, so none are returned; ``attn_mask`` is taken
    only as the causal mask (with ``is_causal=True``).

    The local residual is added in self-attention only: ``mha(x, x, x)``, one tensor as query, key
    and value (torch's own module tells its self-attention path by the same test). Any other call is
    cross-attention and gets none, whatever its lengths: V lies on the keys' positions, not on the
    query's grid. Refused with a ``ValueError``: inputs whose last dimension is not the module's
    embedding dimension (``kdim`` / ``vdim`` for key / value), batched and unbatched inputs mixed,
    and (outside autocast) inputs of a dtype other than the module's parameters'.
    """

    def __init__(self, old: nn.MultiheadAttention, kind: str, grid: Optional[TokenGrid]):
        if old.bias_k is not None or old.add_zero_attn:
            raise ValueError("nn.MultiheadAttention with add_bias_kv or add_zero_attn has no InLine form")
        e = old.embed_dim
        super().__init__(kind, e, old.num_heads, grid, (e // old.num_heads) ** -0.5, e)
        self.embed_dim, self.kdim, self.vdim, self.head_dim = e, old.kdim, old.vdim, e // old.num_heads
        self.batch_first, self.packed_projection = old.batch_first, old._qkv_same_embed_dim
        # torch's TransformerEncoderLayer / TransformerEncoder take their fused inference path (which
        # reads in_proj_weight and computes softmax attention itself, never calling this module) only
        # when this is True
        self._qkv_same_embed_dim = False
        for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias"):
            setattr(self, name, getattr(old, name))
        self.out_proj = old.out_proj

    def _projections(self) -> tuple[tuple[torch.Tensor, ...], tuple[Optional[torch.Tensor], ...]]:
        if self.packed_projection:
            weights = self.in_proj_weight.chunk(3)
        else:
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        biases = (None,) * 3 if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
        return weights, biases

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: Optional[torch.Tensor] = None,
        need_weights: bool = True,
        attn_mask: Optional[torch.Tensor] = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, None]:
        if attn_mask is not None and not is_causal:
            _no_pair_mask(attn_mask)
        batched = self._check_inputs(query, key, value)
        self_attention = query is key and key is value
        key_padding_mask = _padding_as_bool(key_padding_mask)
        if not batched:  # torch's unbatched [L, E]: a batch of one, batch first
            inputs = tuple(t.unsqueeze(0) for t in (query, key, value))
            if isinstance(key_padding_mask, torch.Tensor) and key_padding_mask.dim() == 1:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif self.batch_first:
            inputs = (query, key, value)
        else:
            inputs = tuple(t.transpose(0, 1) for t in (query, key, value))
        weights, biases = self._projections()
        heads = [
            nn.functional.linear(t, w, b).unflatten(-1, (self.num_heads, -1)).transpose(1, 2)
            for t, w, b in zip(inputs, weights, biases, strict=True)
        ]
        out = self.attend(
            inputs[0], *heads, key_padding_mask=key_padding_mask, is_causal=is_causal, self_attention=self_attention
        )
        out = self.out_proj(out)
        if not batched:
            return out.squeeze(0), None
        return (out if self.batch_first else out.transpose(0, 1)), None

    def _check_inputs(self, query, key, value) -> bool:
        """Whether the call is batched; a ValueError naming the input for a wrong shape or dtype."""
        batch_dim = 0 if self.batch_first else 1
        layout = "[N, L, E]" if self.batch_first else "[L, N, E]"
        for name, t, dim in (("query", query, self.embed_dim), ("key", key, self.kdim), ("value", value, self.vdim)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() not in (2, 3) or t.shape[-1] != dim:
                raise ValueError(
                    f"{name} must be {layout} or unbatched [L, E] with embedding dimension E = {dim}, "
                    f"got shape {tuple(t.shape)}"
                )
        shapes = tuple(tuple(t.shape) for t in (query, key, value))
        if not query.dim() == key.dim() == value.dim():
            raise ValueError(f"query, key and value must be all batched or all unbatched, got shapes {shapes}")
        if key.shape[:-1] != value.shape[:-1] or (query.dim() == 3 and query.shape[batch_dim] != key.shape[batch_dim]):
            raise ValueError(
                f"key and value must have one length and batch, and query key's batch ({layout}), got shapes {shapes}"
            )
        expected = self.out_proj.weight.dtype
        if autocast_dtype(query) is None:  # autocast casts the inputs itself
            for name, t in (("query", query), ("key", key), ("value", value)):
                if t.dtype != expected:
                    raise ValueError(
                        f"{name} has dtype {t.dtype}, expected {expected} (the module's parameters'): pass "
                        f"{expected} inputs, or convert the module with .to({t.dtype})"
                    )
        return query.dim() == 3


def _padding_as_bool(mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A key-padding mask as bool (True = padding): torch's transformer layers pass the additive
    form (-inf = padding, 0 = a key), which is all InLine can take of an additive mask."""
    if not isinstance(mask, torch.Tensor) or mask.dtype == torch.bool:
        return mask  # None, or what the op's own check refuses by name
    padded = torch.isneginf(mask)
    if not bool(((mask == 0) | padded).all()):
        raise ValueError("an additive key_padding_mask must hold only 0 (a key) and -inf (padding) for InLine")
    return padded


@dataclass(frozen=True)
class Change:
    """One replaced module: its path, the old and new class, and the parameters added (the local
    residual's predictor) and dropped (e.g. Swin's relative position bias table)."""

    path: str
    old_class: str
    new_class: str
    params_added: int
    params_dropped: int


class ChangeTable(list):
    """The :class:`Change` rows of one :func:`convert`; ``str()`` is a Markdown table."""

    def __str__(self) -> str:
        rows = ["| module | was | now | params added | params dropped |", "|---|---|---|---:|---:|"]
        rows += [
            f"| {c.path} | {c.old_class} | {c.new_class} | {c.params_added:,} | {c.params_dropped:,} |" for c in self
        ]
        return "\n".join(rows)


def _kind_of(module: nn.Module) -> Optional[str]:
    """Which replacement a module takes ("mha", "window", "timm", "eva"), or None."""
    if type(module).__module__.startswith("inline_attn"):
        return None
    if isinstance(module, nn.MultiheadAttention):
        return "mha"

    def has(*names):
        return all(hasattr(module, n) for n in names)

    if has("qkv", "num_heads", "proj", "window_size", "relative_position_bias_table"):
        return "window"
    if has("num_heads", "head_dim", "proj") and (has("qkv") or has("q_proj", "k_proj", "v_proj")):
        if "rope" not in inspect.signature(module.forward).parameters:
            return "timm"
        if has("q_bias", "k_bias", "v_bias"):  # timm's EvaAttention: converts where the model has no rope
            return "eva"
        raise ValueError(f"{type(module).__name__} takes rotary embeddings (rope), which convert does not handle")
    return None


def _refuse_rope(model: nn.Module, targets: list) -> None:
    """EvaAttention converts only where the model computes no rotary embeddings (its ``rope`` is None)."""
    evas = [path for path, _, which in targets if which == "eva"]
    ropes = [path for path, m in model.named_modules() if getattr(m, "rope", None) is not None]
    if evas and ropes:
        where = f"{ropes[0]}.rope" if ropes[0] else "rope"
        raise ValueError(
            f"{evas[0]} (EvaAttention) is called with the rotary embeddings (rope) of the model's {where}: "
            "InLine's linear form here has no rotary version; convert takes EVA models without rope "
            "(use_rot_pos_emb=False)"
        )


def _model_grid(model: nn.Module, num_prefix_tokens: Optional[int], local_residual: Optional[bool]):
    """The model's :class:`TokenGrid` (None: no local residual outside windows)."""
    if local_residual is False:
        return None
    for path in ("patch_embed.proj", "conv_proj"):  # timm, torchvision
        try:
            conv = model.get_submodule(path)
        except AttributeError:
            continue
        grid = TokenGrid()
        grid.follow(conv)
        return grid
    if num_prefix_tokens is not None:
        return TokenGrid(num_prefix_tokens=num_prefix_tokens)
    if local_residual:
        raise ValueError("local_residual=True needs the token grid: no patch convolution found, pass num_prefix_tokens")
    return None


def convert(
    model: nn.Module,
    kind: str = "inline",
    *,
    num_prefix_tokens: Optional[int] = None,
    local_residual: Optional[bool] = None,
) -> ChangeTable:
    """Replace the attention modules of ``model`` in place (see the module docstring).

    Args:
        model: any ``nn.Module``; timm / torchvision models included.
        kind: "inline" (paper Eq. 5 with the local residual) or "linear" (no residual).
        num_prefix_tokens: tokens before a square grid, where the model has no patch convolution.
        local_residual: None = where the grid is known (inline only); False = never; True = required.
    Returns:
        the :class:`ChangeTable` of what changed (``print`` it for a Markdown table).

    A ``ValueError`` names any argument of the wrong type: a model that is no ``nn.Module``, a
    ``local_residual`` that is no bool (``"no"`` is refused, not truthy), a ``num_prefix_tokens``
    that is no int >= 0.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"convert takes an nn.Module whose attention it replaces, got {type(model).__name__}")
    if kind not in CONVERT_KINDS:
        raise ValueError(f"unknown kind {kind!r}: convert takes one of {CONVERT_KINDS}")
    check_flag("local_residual", local_residual, optional=True)
    if num_prefix_tokens is not None:
        num_prefix_tokens = check_count("num_prefix_tokens", num_prefix_tokens)
    grid = _model_grid(model, num_prefix_tokens, local_residual) if kind == "inline" else None
    targets = [(path, m, _kind_of(m)) for path, m in model.named_modules()]
    _refuse_rope(model, targets)
    changes = ChangeTable()
    for path, old, which in targets:
        if which is None:
            continue
        if not path:
            raise ValueError(
                f"convert replaces the attention modules inside a model; got a {type(old).__name__} itself"
            )
        if which == "mha":
            new = InLineMultiheadAttention(old, kind, grid)
        elif which == "window":
            new = InLineWindowAttention(old, kind, kind == "inline" and local_residual is not False)
        elif which == "eva":
            new = InLineEvaAttention(old, kind, grid)
        else:
            new = InLineTimmAttention(old, kind, grid)
        weight = next(old.parameters(), None)
        if new.residual is not None and weight is not None:  # the new predictor where the model's weights are
            new.residual.to(device=weight.device, dtype=weight.dtype)
        parent, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent), name, new)
        kept = {id(p) for p in new.parameters()}
        was = {id(p) for p in old.parameters()}
        added = sum(p.numel() for p in new.parameters() if id(p) not in was)
        dropped = sum(p.numel() for p in old.parameters() if id(p) not in kept)
        changes.append(Change(path, type(old).__name__, type(new).__name__, added, dropped))
    for module in model.modules():  # its nested-tensor fast path would bypass the converted layers
        if isinstance(module, nn.TransformerEncoder):
            module.use_nested_tensor = False
    return changes
