"""Read (or edit) the attention weights of any layer without changing its forward code.

Every attention module in this package derives from :class:`RecordableAttention` and computes
its attention core through :meth:`RecordableAttention.attend_tokens` (token-major tensors, every
kind, the local residual) or :meth:`RecordableAttention.attend` (per-head tensors). Normally those
run the fast ops (for InLine, :func:`inline_attn.ops.inline_tokens`, fused where it applies).
While a hook is installed (by :func:`record_attention` or :func:`hook_attention`), they instead
build the explicit weight matrix, hand an :class:`AttentionRecord` to the hook, and use the weights
the hook returns (or the originals when it returns None): the basis of the attention-map,
confusion, locality and masking analyses. Only the layer running at that moment holds an N x N
matrix.
"""

from __future__ import annotations

import contextlib
import fnmatch
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

import torch
import torch.nn as nn

from ..ops import attention, attention_weights, inline_tokens
from ..ops.dispatch import attention_path, check_impl
from ..ops.tokens import layer_core_tokens
from ..ops.tokens import add_to_grid_tokens, grid_residual
from .linear_family import LINEAR_CORES


@dataclass
class AttentionRecord:
    """One layer's attention in one forward call.

    Attributes:
        name: the module's qualified name in the model ("blocks.3.attn").
        index: position of the layer among the model's attention layers.
        kind: "inline", "linear" or "softmax".
        weights: [B * G, heads, Nq, Nk] weights (G = number of windows / stripes, batch-major;
            G = 1 for global attention).
        feat_size: (H, W) of the token grid this call attends over (a window's size when
            windowed); prefix tokens come first.
        num_prefix_tokens: tokens before the grid (the cls token).
        token_coords: None for global attention over the row-major grid ``feat_size``; else
            [G, Nk, 2] long (row, col) of each key token in the stage's feature map; positions
            outside the map are padding. Queries are the same tokens (self-attention).
    """

    name: str
    index: int
    kind: str
    weights: torch.Tensor
    feat_size: tuple[int, int]
    num_prefix_tokens: int = 0
    token_coords: Optional[torch.Tensor] = None


Hook = Callable[[AttentionRecord], Optional[torch.Tensor]]
Coords = Union[None, torch.Tensor, Callable[[], Optional[torch.Tensor]]]


class RecordableAttention(nn.Module):
    """Base for attention modules: routes the attention core through one hookable method.

    Attributes:
        kind: "inline", "linear", "softmax" or one of the other linear attentions
            (:data:`~inline_attn.layers.linear_family.LINEAR_CORES`, computed by ``self.core``).
        num_heads: heads of the module (set by subclasses).
        impl: this module's implementation, one of :data:`inline_attn.ops.IMPLS` (see
            :mod:`inline_attn.ops.dispatch`); None = the process default. The InLine layer core
            takes any of them; the other kinds have no fused kernel and run naive for "naive",
            eager otherwise (:func:`~inline_attn.ops.dispatch.attention_path`).
    """

    kind: str = "inline"
    num_heads: int = 1
    impl: Optional[str] = None

    def __init__(self, impl: Optional[str] = None):
        super().__init__()
        if impl is not None:
            self.impl = check_impl(impl)
        self._attention_hook: Optional[Hook] = None
        self._record_name = ""
        self._record_index = -1

    @property
    def hooked(self) -> bool:
        """True while an attention hook is installed on this module."""
        return self._attention_hook is not None

    def attend_tokens(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        feat_size: tuple[int, int],
        residual_weights: Optional[torch.Tensor] = None,
        num_prefix_tokens: int = 0,
        kind: Optional[str] = None,
        feature_map=None,
        scale: Optional[float] = None,
        bias: Optional[torch.Tensor] = None,
        mask: Optional[torch.Tensor] = None,
        token_coords: Coords = None,
        attn_drop: Optional[nn.Module] = None,
    ) -> torch.Tensor:
        """The attention core on token-major tensors: the one place a model's path is chosen.

        Args:
            q, k, v: [B, N, C] (views of the projections; head i owns channels
                ``[i*C/h, (i+1)*C/h)`` with ``h = self.num_heads``), ``N = P + H*W``.
            feat_size: (H, W) of the grid tokens; num_prefix_tokens: P.
            residual_weights: [B, C, 3, 3] InLine's predicted 3x3 residual, added on the grid
                tokens' values; None for none.
            kind, feature_map, scale: the attention function (kind defaults to ``self.kind``).
            bias, mask: softmax only (a ``ValueError`` for the other kinds).
            token_coords: for hooks (see :class:`AttentionRecord`); a tensor, or a zero-argument
                callable evaluated only while a hook is installed.
            attn_drop: dropout on softmax weights.

        Returns:
            [B, N, C]. InLine without a hook goes to :func:`inline_attn.ops.inline_tokens` (the
            fused kernels where they apply); the other linear attentions to ``self.core``;
            everything else splits heads and calls :meth:`attend`.
        """
        kind = kind or self.kind
        if kind != "softmax" and (bias is not None or mask is not None):
            raise ValueError(f"bias and mask apply to softmax attention only, got kind={kind!r}")
        p = num_prefix_tokens
        if kind == "inline" and not self.hooked:
            return inline_tokens(
                q,
                k,
                v,
                num_heads=self.num_heads,
                feat_size=feat_size,
                residual_weights=residual_weights,
                num_prefix_tokens=p,
                feature_map=feature_map,
                scale=scale,
                impl=self.impl,
            )
        if kind in LINEAR_CORES:
            hook = None
            if self.hooked:

                def hook(w):
                    return self.hook_weights(w, kind, feat_size, p, token_coords)

            out = self.core(q, k, v, feat_size, p, impl=attention_path(self.impl), weight_hook=hook)
        else:
            out = self._attend_heads(
                q, k, v, feat_size, kind, feature_map, scale, bias, mask, p, token_coords, attn_drop
            )
        if residual_weights is not None:
            res = grid_residual(v, residual_weights, feat_size, p, impl=attention_path(self.impl))
            out = add_to_grid_tokens(out, res.to(out.dtype), p)
        return out

    def attend_predicted(
        self,
        x: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        residual: nn.Module,
        feat_size: tuple[int, int],
        num_prefix_tokens: int = 0,
        scale: float,
        **kwargs,
    ) -> torch.Tensor:
        """:meth:`attend_tokens` with the residual weights predicted by ``residual`` (a
        :class:`~inline_attn.layers.LocalResidual` of this module's channels and heads) from the
        token mean of the layer input x [B, N, C]; q, k, v: x's shape, from this module's own
        projections; ``feat_size``: (H, W) ints the caller has checked against N; keyword
        arguments as :meth:`attend_tokens`.

        InLine without a hook, bias or mask goes to :func:`inline_attn.ops.tokens.layer_core_tokens`
        (no checks repeated: the module's construction and forward made them), which runs the
        prediction inside the fused layer core where it applies."""
        kind = kwargs.get("kind") or self.kind
        hooked = self._attention_hook is not None  # (self.hooked, without a property call on the host path)
        if kind == "inline" and not hooked and kwargs.get("bias") is None and kwargs.get("mask") is None:
            params = residual.predictor_params()
            feature_map = kwargs.get("feature_map")
            args = (self.num_heads, feat_size, num_prefix_tokens, feature_map, scale, self.impl)
            return layer_core_tokens(x, q, k, v, params, *args)
        weights = residual.predict(x.mean(dim=1))
        return self.attend_tokens(
            q,
            k,
            v,
            residual_weights=weights,
            feat_size=feat_size,
            num_prefix_tokens=num_prefix_tokens,
            scale=scale,
            **kwargs,
        )

    def _attend_heads(self, q, k, v, feat_size, kind, feature_map, scale, bias, mask, p, token_coords, attn_drop):
        """[B, N, C] tensors -> heads -> :meth:`attend` -> [B, N, C]."""
        b, n, c = q.shape

        def heads(t):  # [B, N, C] -> [B, h, N, d] view
            return t.reshape(b, n, self.num_heads, c // self.num_heads).transpose(1, 2)

        out = self.attend(
            heads(q),
            heads(k),
            heads(v),
            feat_size=feat_size,
            kind=kind,
            feature_map=feature_map,
            scale=scale,
            bias=bias,
            mask=mask,
            num_prefix_tokens=p,
            token_coords=token_coords,
            attn_drop=attn_drop,
        )
        return out.transpose(1, 2).reshape(b, n, c)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        feat_size: tuple[int, int],
        kind: Optional[str] = None,
        feature_map=None,
        scale: Optional[float] = None,
        bias: Optional[torch.Tensor] = None,
        mask: Optional[torch.Tensor] = None,
        num_prefix_tokens: int = 0,
        token_coords: Coords = None,
        attn_drop: Optional[nn.Module] = None,
    ) -> torch.Tensor:
        """q: [B, h, N, d], k: [B, h, N, d], v: [B, h, N, dv] -> [B, h, N, dv].

        ``token_coords`` (a tensor or a zero-argument callable) is only used while a hook is
        installed."""
        kind = kind or self.kind
        if kind == "linear":  # the layer's head_dim**-0.5: linear attention's normalisation cancels it
            scale = None
        hook = self._attention_hook
        if hook is None:
            if kind == "softmax" and attn_drop is not None and attn_drop.p > 0 and self.training:
                w = attention_weights(q, k, kind=kind, scale=scale, bias=bias, mask=mask)
                return attn_drop(w) @ v
            impl = attention_path(self.impl)
            return attention(q, k, v, kind=kind, feature_map=feature_map, scale=scale, bias=bias, mask=mask, impl=impl)
        weights = attention_weights(q, k, kind=kind, feature_map=feature_map, scale=scale, bias=bias, mask=mask)
        weights = self.hook_weights(weights, kind, feat_size, num_prefix_tokens, token_coords)
        if attn_drop is not None and kind == "softmax":
            weights = attn_drop(weights)
        return weights @ v

    def hook_weights(
        self,
        weights: torch.Tensor,
        kind: str,
        feat_size: tuple[int, int],
        num_prefix_tokens: int = 0,
        token_coords: Coords = None,
    ) -> torch.Tensor:
        """Hand explicit weights [B * G, heads, N, N] to the installed hook; return the weights to use
        (the hook's replacement, or ``weights`` when there is no hook or it returns None)."""
        hook = self._attention_hook
        if hook is None:
            return weights
        record = AttentionRecord(
            name=self._record_name,
            index=self._record_index,
            kind=kind,
            weights=weights,
            feat_size=tuple(int(s) for s in feat_size),
            num_prefix_tokens=num_prefix_tokens,
            token_coords=token_coords() if callable(token_coords) else token_coords,
        )
        replaced = hook(record)
        if replaced is None:
            return weights
        if replaced.shape != weights.shape:
            raise ValueError(
                f"attention hook returned weights of shape {tuple(replaced.shape)}, expected {tuple(weights.shape)}"
            )
        return replaced


def attention_layers(model: nn.Module) -> list[tuple[str, RecordableAttention]]:
    """The model's attention modules in forward order of definition: [(name, module)]."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, RecordableAttention)]


def select_layers(layers_all, layers) -> list[tuple[int, str, RecordableAttention]]:
    """The ``(index, name, module)`` of ``layers_all`` (from :func:`attention_layers`) that ``layers``
    picks: all for None, else indices (negative count from the end) or fnmatch patterns on the names;
    anything else (a float, a bool) is a ValueError."""
    indexed = [(i, n, m) for i, (n, m) in enumerate(layers_all)]
    if layers is None:
        return indexed
    picks = [layers] if isinstance(layers, (int, str)) else list(layers) if isinstance(layers, Iterable) else None
    # fnmatch would fail deep inside on a float, and True would pick layer 1
    if picks is None or any(isinstance(s, bool) or not isinstance(s, (int, str)) for s in picks):
        raise ValueError(
            f"layers={layers!r}: expected None, a layer index (int), a name pattern (str) or a sequence of them"
        )
    chosen = []
    for sel in picks:
        if isinstance(sel, int):
            if not -len(indexed) <= sel < len(indexed):
                raise ValueError(f"layer index {sel} out of range: the model has {len(indexed)} attention layers")
            chosen.append(indexed[sel])
        else:
            hits = [t for t in indexed if fnmatch.fnmatchcase(t[1], sel)]
            if not hits:
                raise ValueError(f"no attention layer matches {sel!r}; layers: {[t[1] for t in indexed]}")
            chosen.extend(hits)
    return chosen


@contextlib.contextmanager
def hook_attention(
    model: nn.Module, hook: Hook, *, layers: Union[None, int, str, Sequence[Union[int, str]]] = None
) -> Iterator[list[tuple[int, str, RecordableAttention]]]:
    """Install ``hook`` on the chosen attention layers for the duration of the block.

    ``layers``: None (all), indices into :func:`attention_layers`, or fnmatch patterns of names.
    The hook receives an :class:`AttentionRecord` and may return replacement weights.
    """
    chosen = select_layers(attention_layers(model), layers)
    if not chosen:
        raise ValueError(f"{type(model).__name__} has no attention layers to hook")
    try:
        for i, n, m in chosen:
            m._attention_hook, m._record_name, m._record_index = hook, n, i
        yield chosen
    finally:
        for _, _, m in chosen:
            m._attention_hook = None


@contextlib.contextmanager
def record_attention(model: nn.Module, *, layers=None, to_cpu: bool = True) -> Iterator[list[AttentionRecord]]:
    """Collect every chosen layer's :class:`AttentionRecord` (weights detached) into a list.

    This keeps all N x N matrices; for large models prefer :func:`hook_attention` with a hook
    that reduces each record as it arrives.
    """
    records: list[AttentionRecord] = []

    def keep(rec: AttentionRecord) -> None:
        w = rec.weights.detach()
        rec.weights = w.cpu() if to_cpu else w
        records.append(rec)

    with hook_attention(model, keep, layers=layers):
        yield records
