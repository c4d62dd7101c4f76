"""Semantic confusion (paper Fig. 1 and Fig. 3): different queries that get the same weights.

Definition used throughout (docs/analysis.md): in one attention call, for one image and one
head, two different queries i != j are *confused* when their attention weight rows are equal
within a tolerance::

    max_k |w_ik - w_jk| <= tol,      tol = rtol / N_k   (default rtol = 1e-3)

i.e. no weight differs by more than 0.1 % of the uniform weight 1 / N_k. All real query tokens
count (the cls token included, padding tokens of padded windows excluded). A layer's count for
an image is the number of confused pairs summed over heads and windows; an image's count is the
sum over the analysed layers. Linear attention confuses every pair of queries whose features
phi(q) are collinear (paper Proposition 2); softmax and InLine attention are injective and
confuse (almost) none.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch

from .._io import save_figure
from ..layers.record import AttentionRecord
from .tokens import expand_groups, token_layout

DEFAULT_RTOL = 1e-3
_CHUNK_ELEMS = 1 << 24  # bounds the pairwise-distance buffer (elements) per chunk


def row_tolerance(num_keys: int, rtol: float = DEFAULT_RTOL, atol: Optional[float] = None) -> float:
    """The absolute tolerance on max |w_ik - w_jk|: ``atol`` if given, else ``rtol / num_keys``."""
    if atol is not None:
        if atol < 0:
            raise ValueError(f"atol must be >= 0, got {atol}")
        return float(atol)
    if rtol < 0:
        raise ValueError(f"rtol must be >= 0, got {rtol}")
    return float(rtol) / num_keys


def confused_pairs(
    weights: torch.Tensor,
    *,
    rtol: float = DEFAULT_RTOL,
    atol: Optional[float] = None,
    valid: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Count pairs of different queries with equal weight rows (within the tolerance).

    Args:
        weights: [..., Nq, Nk] attention weights.
        rtol, atol: tolerance, see :func:`row_tolerance`.
        valid: [..., Nq] bool (broadcastable), queries that take part (default all).

    Returns:
        [...] long: number of pairs i < j, both valid, with ``max_k |w_ik - w_jk| <= tol``.
    """
    if weights.dim() < 2:
        raise ValueError(f"weights must be [..., Nq, Nk], got shape {tuple(weights.shape)}")
    lead, nq, nk = weights.shape[:-2], weights.shape[-2], weights.shape[-1]
    tol = row_tolerance(nk, rtol, atol)
    w = weights.reshape(-1, nq, nk)
    if valid is None:
        ok = torch.ones(w.shape[0], nq, dtype=torch.bool, device=w.device)
    else:
        ok = valid.to(w.device).expand(*lead, nq).reshape(-1, nq)
    upper = torch.ones(nq, nq, dtype=torch.bool, device=w.device).triu(1)
    counts = torch.empty(w.shape[0], dtype=torch.long, device=w.device)
    step = max(1, _CHUNK_ELEMS // (nq * nq))
    for s in range(0, w.shape[0], step):
        # L-infinity distance between every pair of rows of one (image, head, window).
        d = torch.cdist(w[s : s + step], w[s : s + step], p=float("inf"))
        hit = (d <= tol) & upper & ok[s : s + step, :, None] & ok[s : s + step, None, :]
        counts[s : s + step] = hit.sum(dim=(-2, -1))
    return counts.reshape(lead)


def distinct_rows(weights: torch.Tensor, *, rtol: float = DEFAULT_RTOL, atol: Optional[float] = None) -> int:
    """Number of distinct rows of ``weights: [M, Nk]``: rows within the tolerance of an earlier
    row count once (greedy, in order)."""
    if weights.dim() != 2:
        raise ValueError(f"weights must be [M, Nk], got shape {tuple(weights.shape)}")
    tol = row_tolerance(weights.shape[-1], rtol, atol)
    kept: list[torch.Tensor] = []
    for row in weights:
        if all((row - k).abs().max() > tol for k in kept):
            kept.append(row)
    return len(kept)


class ConfusionCounter:
    """Attention hook: per image and layer, the number of confused query pairs.

    Call :meth:`start_batch` before each forward; after it, :attr:`batch_counts` maps a layer
    index to a [B] long tensor (summed over heads, windows and over several calls of the layer),
    and :attr:`batch_pairs` to the [B] number of query pairs compared (the denominator of a
    confusion rate: windowed attention compares only pairs that share a window).
    Nothing larger than one call's [B*G, h, N, N] weights is ever held.
    """

    def __init__(self, *, rtol: float = DEFAULT_RTOL, atol: Optional[float] = None, map_sizes=None):
        self.rtol, self.atol = rtol, atol
        self.map_sizes = map_sizes or {}
        self.batch_counts: dict[int, torch.Tensor] = {}
        self.batch_pairs: dict[int, torch.Tensor] = {}
        self.names: dict[int, str] = {}

    def start_batch(self) -> None:
        self.batch_counts = {}
        self.batch_pairs = {}

    def __call__(self, rec: AttentionRecord) -> None:
        layout = token_layout(rec, self.map_sizes.get(rec.name))
        w = rec.weights.detach()
        bg, heads = w.shape[:2]
        b = bg // layout.num_groups
        p = layout.num_prefix_tokens
        real = layout.grid.clone()
        real[:, :p] = True  # prefix (cls) queries count; only padding is left out
        valid = expand_groups(real, b).to(w.device)[:, None, :]  # [BG, 1, N]
        counts = confused_pairs(w, rtol=self.rtol, atol=self.atol, valid=valid)  # [BG, h]
        per_image = counts.reshape(b, -1).sum(dim=1).cpu()
        n_valid = valid.sum(dim=-1).reshape(bg).long().cpu()  # [BG]
        pairs = (n_valid * (n_valid - 1) // 2 * heads).reshape(b, -1).sum(dim=1)
        self.names[rec.index] = rec.name
        for store, value in ((self.batch_counts, per_image), (self.batch_pairs, pairs)):
            prev = store.get(rec.index)
            store[rec.index] = value if prev is None else prev + value


def confusion_counts(
    model: torch.nn.Module,
    batches: Iterable,
    *,
    layers=None,
    rtol: float = DEFAULT_RTOL,
    atol: Optional[float] = None,
    progress: bool = True,
    desc: str = "confusion",
) -> dict:
    """Confused-pair counts of ``model`` on ``batches`` (iterable of (x [B, C, H, W], y)).

    Returns:
        {"layers": [(index, name)], "counts": [num_images, num_layers] long tensor, "pairs": the
        same shape, query pairs compared}.
    """
    from .runner import map_sizes_for, run_hooked

    counter = ConfusionCounter(rtol=rtol, atol=atol)
    rows: list[torch.Tensor] = []
    pair_rows: list[torch.Tensor] = []
    chosen_idx: list[int] = []

    def per_batch(x, y, chosen):
        if not chosen_idx:
            chosen_idx.extend(i for i, _, _ in chosen)
            counter.map_sizes = map_sizes_for(model, x.shape[-2:])
        counter.start_batch()
        return counter

    def after_batch(x, y, out):
        for store, into in ((counter.batch_counts, rows), (counter.batch_pairs, pair_rows)):
            zero = torch.zeros(x.shape[0], dtype=torch.long)
            into.append(torch.stack([store.get(i, zero) for i in chosen_idx], dim=1))

    run_hooked(model, batches, per_batch, after_batch, layers=layers, progress=progress, desc=desc)
    names = [counter.names.get(i, "") for i in chosen_idx]
    return {
        "layers": list(zip(chosen_idx, names)),
        "counts": torch.cat(rows) if rows else torch.zeros(0, 0, dtype=torch.long),
        "pairs": torch.cat(pair_rows) if pair_rows else torch.zeros(0, 0, dtype=torch.long),
    }


def plot_confusion_histogram(per_model: dict, path, *, title: Optional[str] = None) -> None:
    """Histogram over images of the per-image confusion count, one bar series per model.

    per_model: {label: [num_images] counts (summed over layers)}. Counts are heavy-tailed, so
    the bins are 0, 1, 2-3, 4-7, 8-15, ... (powers of two) and the bars of the models stand
    side by side.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    top = max([float(np.max(v)) for v in per_model.values() if len(v)] + [1.0])
    edges = [0, 1] + [2**i for i in range(1, int(np.floor(np.log2(top))) + 2)]
    names = [str(a) if b - a == 1 else f"{a}-{b - 1}" for a, b in zip(edges[:-1], edges[1:])]
    x = np.arange(len(names))
    width = 0.8 / max(1, len(per_model))
    fig, ax = plt.subplots(figsize=(6.0, 3.4), dpi=90)
    for i, (label, vals) in enumerate(per_model.items()):
        vals = np.asarray(vals, dtype=float)
        hist, _ = np.histogram(vals, bins=np.asarray(edges, dtype=float) - 0.5)
        frac = float((vals > 0).mean()) if len(vals) else 0.0
        ax.bar(
            x + (i - (len(per_model) - 1) / 2) * width,
            hist,
            width,
            label=f"{label}: mean {vals.mean():.1f}, {100 * frac:.0f}% of images > 0",
        )
    ax.set_xticks(x)
    ax.set_xticklabels(names, fontsize=7, rotation=30)
    ax.set_xlabel("confused query pairs per image (all layers and heads)")
    ax.set_ylabel("images")
    ax.set_title(title or "Semantic confusion (cf. paper Fig. 3)", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def summarize(counts: torch.Tensor, pairs: Optional[torch.Tensor] = None) -> dict:
    """Mean / median / max of per-image totals, and the fraction of images with any confusion;
    with ``pairs`` (the query pairs compared, same shape), ``pairs_per_image`` and ``rate``: the
    share of all compared pairs that are confused."""
    tot = counts.sum(dim=1).double() if counts.numel() else torch.zeros(0, dtype=torch.double)
    if tot.numel() == 0:
        return {"images": 0}
    out = {
        "images": int(tot.numel()),
        "mean": float(tot.mean()),
        "median": float(tot.median()),
        "max": float(tot.max()),
        "frac_images_confused": float((tot > 0).double().mean()),
    }
    if pairs is not None and pairs.numel():
        total = float(pairs.double().sum())
        out["pairs_per_image"] = total / tot.numel()
        out["rate"] = float(tot.sum()) / total if total else 0.0
    return out


__all__: Sequence[str] = (
    "DEFAULT_RTOL",
    "ConfusionCounter",
    "confused_pairs",
    "confusion_counts",
    "distinct_rows",
    "plot_confusion_histogram",
    "row_tolerance",
    "summarize",
)
