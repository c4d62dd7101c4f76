"""Read (or edit) the attention weights of any layer without changing its forward code.

Every attention module in this package derives from :class:`RecordableAttention` and computes
attention through :meth:`RecordableAttention.attend`. Normally that runs the fast op. While a
hook is installed (by :func:`record_attention` or :func:`hook_attention`), it instead builds the
explicit weight matrix, hands an :class:`AttentionRecord` to the hook, and uses the weights the
hook returns (or the originals when it returns None): the basis of the attention-map, confusion,
locality and masking analyses. Only the layer running at that moment holds an N x N matrix.
"""
from __future__ import annotations

import contextlib
import fnmatch
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Sequence, Union

import torch
import torch.nn as nn

from ..ops import attention, attention_weights


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


class RecordableAttention(nn.Module):
    """Base for attention modules: routes the attention core through one hookable method."""

    kind: str = "inline"

    def __init__(self):
        super().__init__()
        self._attention_hook: Optional[Hook] = None
        self._record_name = ""
        self._record_index = -1

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        feat_size: tuple[int, int],
        kind: Optional[str] = None,
        kernel=None,
        scale: Optional[float] = None,
        bias: Optional[torch.Tensor] = None,
        mask: Optional[torch.Tensor] = None,
        num_prefix_tokens: int = 0,
        token_coords: Optional[torch.Tensor] = None,
        attn_drop: Optional[nn.Module] = None,
    ) -> torch.Tensor:
        """q: [B, h, N, d], k: [B, h, N, d], v: [B, h, N, dv] -> [B, h, N, dv]."""
        kind = kind or self.kind
        hook = self._attention_hook
        if hook is None:
            if kind == "softmax" and attn_drop is not None and attn_drop.p > 0 and self.training:
                w = attention_weights(q, k, kind=kind, scale=scale, bias=bias, mask=mask)
                return attn_drop(w) @ v
            return attention(q, k, v, kind=kind, kernel=kernel, scale=scale, bias=bias, mask=mask)
        weights = attention_weights(q, k, kind=kind, kernel=kernel, scale=scale, bias=bias, mask=mask)
        record = AttentionRecord(
            name=self._record_name, index=self._record_index, kind=kind, weights=weights,
            feat_size=tuple(int(s) for s in feat_size), num_prefix_tokens=num_prefix_tokens,
            token_coords=token_coords,
        )
        replaced = hook(record)
        if replaced is not None:
            if replaced.shape != weights.shape:
                raise ValueError(
                    f"attention hook returned weights of shape {tuple(replaced.shape)}, "
                    f"expected {tuple(weights.shape)}"
                )
            weights = replaced
        if attn_drop is not None and kind == "softmax":
            weights = attn_drop(weights)
        return weights @ v


def attention_layers(model: nn.Module) -> list[tuple[str, RecordableAttention]]:
    """The model's attention modules in forward order of definition: [(name, module)]."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, RecordableAttention)]


def _select(layers_all, layers) -> list[tuple[int, str, RecordableAttention]]:
    indexed = [(i, n, m) for i, (n, m) in enumerate(layers_all)]
    if layers is None:
        return indexed
    if isinstance(layers, (int, str)):
        layers = [layers]
    chosen = []
    for sel in layers:
        if isinstance(sel, int):
            if not -len(indexed) <= sel < len(indexed):
                raise ValueError(
                    f"layer index {sel} out of range: the model has {len(indexed)} attention layers"
                )
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
    chosen = _select(attention_layers(model), layers)
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
def record_attention(
    model: nn.Module, *, layers=None, to_cpu: bool = True
) -> Iterator[list[AttentionRecord]]:
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
