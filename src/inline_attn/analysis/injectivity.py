"""Injectivity on constructed queries (paper Fig. 1, Propositions 1-2).

Fixed random keys K ([N, d], general position) and two families of M distinct queries:

- ``collinear``: ``q_m = a_m u`` for lengths a_m (0.5, 1, 2, 4). ReLU linear attention gives
  every one of them the same weights, because ``relu(a u) = a relu(u)`` and the division removes
  a.
- ``shifted``: ``q_m = a_m (u + c) - c``, queries that differ by a shift-and-scale around -c.
  Linear attention with the affine feature map ``phi(x) = x + c`` (identity plus an offset that makes
  the features positive) maps them to collinear features ``a_m (u + c)``: same weights again.

Softmax and InLine (identity feature map) attention give M distinct rows for both families: they are
injective (the centred keys span R^d). Together the two families show that linear attention is
not injective whatever its feature map: any queries with collinear features collapse.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .._io import save_figure
from ..ops import attention_weights
from .confusion import DEFAULT_RTOL, confused_pairs, distinct_rows, row_tolerance

LENGTHS = (0.5, 1.0, 2.0, 4.0)
KINDS = ("softmax", "linear_relu", "linear_affine", "inline")
KIND_LABELS = {
    "softmax": "softmax",
    "linear_relu": "linear, phi = ReLU",
    "linear_affine": "linear, phi = x + c",
    "inline": "InLine, phi = identity",
}


def constructed_problem(num_keys: int = 8, dim: int = 4, lengths: Sequence[float] = LENGTHS, seed: int = 0) -> dict:
    """Keys, the affine feature map's offset and both query families (float64).

    Returns {"keys": [N, d], "offset": c (float), "collinear": [M, d], "shifted": [M, d],
    "lengths": list}.
    """
    if num_keys < dim + 1:
        raise ValueError(f"num_keys={num_keys} must exceed dim={dim} so centred keys can span R^d")
    if len(lengths) < 2 or len(set(lengths)) != len(lengths) or min(lengths) <= 0:
        raise ValueError(f"lengths must be >= 2 distinct positive numbers, got {list(lengths)}")
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(num_keys, dim, generator=g, dtype=torch.float64)
    u = torch.randn(dim, generator=g, dtype=torch.float64)
    u[0] = -u[0].abs()  # a negative entry: ReLU features differ from the raw query
    # offset making u + c and every key + c positive, so phi(x) = x + c is a valid linear-attention feature map
    c = 1.0 + max(0.0, float(-keys.min()), float(-u.min()))
    a = torch.tensor(list(lengths), dtype=torch.float64)[:, None]
    return {
        "keys": keys,
        "offset": c,
        "lengths": list(lengths),
        "collinear": a * u,
        "shifted": a * (u + c) - c,
    }


def weight_rows(queries: torch.Tensor, keys: torch.Tensor, kind: str, offset: float) -> torch.Tensor:
    """queries: [M, d], keys: [N, d] -> [M, N] weights of one kind (see :data:`KINDS`)."""
    q, k = queries[None, None], keys[None, None]
    if kind == "softmax":
        w = attention_weights(q, k, kind="softmax")
    elif kind == "linear_relu":
        w = attention_weights(q, k, kind="linear", feature_map="relu")
    elif kind == "linear_affine":
        w = attention_weights(q, k, kind="linear", feature_map=lambda x: x + offset)
    elif kind == "inline":
        w = attention_weights(q, k, kind="inline", feature_map="identity")
    else:
        raise ValueError(f"unknown kind {kind!r}: expected one of {KINDS}")
    return w[0, 0]


def injectivity(
    *,
    num_keys: int = 8,
    dim: int = 4,
    lengths: Sequence[float] = LENGTHS,
    seed: int = 0,
    rtol: float = DEFAULT_RTOL,
) -> dict:
    """Weight rows of each kind for both query families, with distinct-row and confused-pair counts.

    Returns {"problem": constructed_problem(...), "results": {family: {kind: {"weights": [M, N],
    "distinct_rows": int, "confused_pairs": int}}}}.
    """
    prob = constructed_problem(num_keys, dim, lengths, seed)
    results: dict = {}
    for family in ("collinear", "shifted"):
        results[family] = {}
        for kind in KINDS:
            w = weight_rows(prob[family], prob["keys"], kind, prob["offset"])
            results[family][kind] = row_counts(w, atol=row_tolerance(w.shape[-1], rtol))
    return {"problem": prob, "results": results}


def row_counts(weights: torch.Tensor, *, atol: float) -> dict:
    """``{"weights": [M, Nk], "distinct_rows", "confused_pairs"}`` of one family's weight rows, rows
    equal when no entry differs by more than ``atol``."""
    return {
        "weights": weights,
        "distinct_rows": distinct_rows(weights, atol=atol),
        "confused_pairs": int(confused_pairs(weights, atol=atol)),
    }


def to_json(res: dict) -> dict:
    """A JSON-serialisable copy of :func:`injectivity`'s result."""
    prob = res["problem"]
    out = {
        "keys": prob["keys"].tolist(),
        "offset": prob["offset"],
        "lengths": prob["lengths"],
        "queries": {f: prob[f].tolist() for f in ("collinear", "shifted")},
        "results": {},
    }
    for fam, per_kind in res["results"].items():
        out["results"][fam] = {
            kind: {
                "weights": r["weights"].tolist(),
                "distinct_rows": r["distinct_rows"],
                "confused_pairs": r["confused_pairs"],
                "queries": len(r["weights"]),
            }
            for kind, r in per_kind.items()
        }
    return out


def plot_injectivity(res: dict, path, *, title: Optional[str] = None) -> None:
    """Heatmaps: rows = query families, columns = attention kinds; each panel is the [M, N]
    weight matrix of that family's queries, titled with its number of distinct rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = list(res["results"])
    fig, axes = plt.subplots(
        len(fams), len(KINDS), figsize=(2.5 * len(KINDS), 1.9 * len(fams) + 0.6), dpi=100, squeeze=False
    )
    lengths = res["problem"]["lengths"]
    for r, fam in enumerate(fams):
        for c, kind in enumerate(KINDS):
            ax = axes[r, c]
            item = res["results"][fam][kind]
            w = item["weights"].numpy()
            ax.imshow(w, cmap="viridis", aspect="auto")
            ax.set_title(f"{KIND_LABELS[kind]}\n{item['distinct_rows']}/{len(w)} distinct rows", fontsize=8)
            ax.set_xticks(range(w.shape[1]))
            ax.set_xticklabels([str(j) for j in range(w.shape[1])], fontsize=6)
            ax.set_yticks(range(len(lengths)))
            ax.set_yticklabels([f"a={a:g}" for a in lengths], fontsize=7)
            if c == 0:
                ax.set_ylabel(f"{fam} queries", fontsize=8)
            if r == len(fams) - 1:
                ax.set_xlabel("key", fontsize=7)
    fig.suptitle(title or "Attention weights of distinct queries (cf. paper Fig. 1)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
