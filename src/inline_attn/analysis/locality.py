"""Local bias of attention (paper Fig. 5): weight mass on each query's 3 x 3 neighbourhood.

For a grid query i, ``mass_i = sum_{j in nbhd3(i)} w_ij`` with the neighbourhood taken in image
coordinates (clipped at the map's edges; the query itself included; prefix and padding keys
never included). A layer's locality is the mean of ``mass_i`` over heads, grid queries (the cls
query has no position and is left out) and images. Uniform attention over N keys gives
``|nbhd3(i)| / N``: 9/N for an interior query (the paper's baseline, 9/197 for DeiT-T), less at
the edges; both the paper's nominal 9/N and the exact uniform value are reported.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch

from .._io import save_figure
from ..layers.record import AttentionRecord
from .tokens import TokenLayout, expand_groups, interior_queries, token_layout, window_mask


def local_mass(weights: torch.Tensor, near: torch.Tensor) -> torch.Tensor:
    """weights: [B*G, h, Nq, Nk], near: [B*G or G, Nq, Nk] bool -> [B*G, h, Nq] mass on ``near``."""
    if near.shape[0] != weights.shape[0]:
        near = expand_groups(near, weights.shape[0] // near.shape[0])
    return (weights * near[:, None].to(weights.dtype)).sum(dim=-1)


def uniform_locality(layout: TokenLayout, k: int = 3, *, interior_only: bool = False) -> float:
    """Locality of uniform attention (every key 1/N) over the layout's grid queries."""
    near = window_mask(layout, k)
    count = near.sum(-1).double()  # [G, Nq] keys in each query's window
    q = interior_queries(layout, k) if interior_only else layout.grid
    return float((count[q] / layout.num_tokens).mean()) if q.any() else float("nan")


def record_locality(
    rec: AttentionRecord, *, k: int = 3, map_size=None, interior_only: bool = False
) -> tuple[torch.Tensor, torch.Tensor, TokenLayout]:
    """One call's local mass per image: (sum over heads and grid queries [B], count [B], layout).

    ``interior_only``: only queries whose whole k x k window lies inside the map (then uniform
    attention gives exactly k*k/N).
    """
    layout = token_layout(rec, map_size)
    w = rec.weights.detach()
    near = window_mask(layout, k, device=w.device)  # [G, N, N]
    q = interior_queries(layout, k) if interior_only else layout.grid
    b = w.shape[0] // layout.num_groups
    mass = local_mass(w, near)  # [BG, h, N]
    qmask = expand_groups(q, b).to(w.device)[:, None, :].expand_as(mass)
    total = (mass * qmask).reshape(b, -1).sum(dim=1).double().cpu()
    count = qmask.reshape(b, -1).sum(dim=1).double().cpu()
    return total, count, layout


class LocalityMeter:
    """Attention hook accumulating each layer's local mass over every call and image."""

    def __init__(self, *, k: int = 3, map_sizes=None, interior_only: bool = False):
        self.k, self.interior_only = k, interior_only
        self.map_sizes = map_sizes or {}
        self.sums: dict[int, float] = {}
        self.counts: dict[int, float] = {}
        self.info: dict[int, dict] = {}

    def __call__(self, rec: AttentionRecord) -> None:
        total, count, layout = record_locality(
            rec, k=self.k, map_size=self.map_sizes.get(rec.name), interior_only=self.interior_only
        )
        i = rec.index
        self.sums[i] = self.sums.get(i, 0.0) + float(total.sum())
        self.counts[i] = self.counts.get(i, 0.0) + float(count.sum())
        if i not in self.info:
            self.info[i] = {
                "layer": i,
                "name": rec.name,
                "kind": rec.kind,
                "num_keys": layout.num_tokens,
                "uniform": uniform_locality(layout, self.k, interior_only=self.interior_only),
                "nominal_uniform": self.k * self.k / layout.num_tokens,
            }

    def rows(self) -> list[dict]:
        out = []
        for i in sorted(self.info):
            row = dict(self.info[i])
            row["locality"] = self.sums[i] / self.counts[i] if self.counts[i] else float("nan")
            row["ratio_to_uniform"] = row["locality"] / row["uniform"] if row["uniform"] else float("nan")
            out.append(row)
        return out


def locality(
    model: torch.nn.Module,
    batches: Iterable,
    *,
    layers=None,
    k: int = 3,
    interior_only: bool = False,
    progress: bool = True,
    desc: str = "locality",
) -> list[dict]:
    """Per-layer locality of ``model`` on ``batches``: rows with layer, name, kind, num_keys,
    locality, uniform (exact), nominal_uniform (k*k/N), ratio_to_uniform."""
    from .runner import map_sizes_for, run_hooked

    meter = LocalityMeter(k=k, interior_only=interior_only)

    def per_batch(x, y, chosen):
        if not meter.map_sizes:
            meter.map_sizes = map_sizes_for(model, x.shape[-2:])
        return meter

    run_hooked(model, batches, per_batch, layers=layers, progress=progress, desc=desc)
    return meter.rows()


def plot_locality(per_model: dict, path, *, title: Optional[str] = None) -> None:
    """Line plot: per layer locality for each model, dashed: each model's uniform baseline.

    per_model: {label: rows from :func:`locality`}.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    many = len(per_model) > 10  # more models than the default colour cycle: tab20 and legend beside
    fig, ax = plt.subplots(figsize=(7.0 if many else 5.5, 3.4), dpi=90)
    baselines_drawn = set()
    for i, (label, rows) in enumerate(per_model.items()):
        xs = [r["layer"] for r in rows]
        colour = plt.get_cmap("tab20")(i % 20) if many else f"C{i % 10}"
        (line,) = ax.plot(xs, [r["locality"] for r in rows], marker="os^Dv<>P"[i % 8], color=colour, label=label)
        base = tuple(round(r["uniform"], 6) for r in rows)
        if base not in baselines_drawn:
            baselines_drawn.add(base)
            ax.plot(
                xs,
                [r["uniform"] for r in rows],
                ls="--",
                color="gray",
                lw=1,
                label="uniform attention" if len(baselines_drawn) == 1 else None,
            )
    layers = sorted({r["layer"] for rows in per_model.values() for r in rows})
    ax.set_xticks(layers)
    ax.set_xlabel("attention layer")
    ax.set_ylabel("mass on the 3x3 neighbourhood")
    ax.set_title(title or "Local attention (cf. paper Fig. 5)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7 if many else 8, **({"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)} if many else {}))
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
