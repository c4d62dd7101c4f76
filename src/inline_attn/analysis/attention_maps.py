"""Attention maps (paper Fig. 4): chosen queries' weight rows laid out on the image.

A query is named by its position as fractions of the image height and width (``"0.5,0.5"`` is
the token at the centre) or by ``"cls"``. Its weight row (mean over heads, summed over the calls
of a layer, e.g. CSwin's two stripe branches) is scattered onto the stage's feature map by the
keys' image coordinates, so windowed and stripe layers give a map too (zero outside the window
or stripe). The weight on the cls key is reported separately.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence, Union

import torch

from .._io import save_figure
from ..layers.record import AttentionRecord
from .tokens import token_layout

QuerySpec = Union[str, tuple[float, float]]


def parse_query(spec: Union[str, Sequence[float]]) -> QuerySpec:
    """``"cls"`` or ``"row,col"`` fractions in [0, 1] -> "cls" or (row_frac, col_frac)."""
    if isinstance(spec, str):
        s = spec.strip().lower()
        if s == "cls":
            return "cls"
        parts = s.split(",")
        try:
            vals = tuple(float(p) for p in parts)
        except ValueError:
            vals = ()
    else:
        vals = tuple(float(v) for v in spec)
    if len(vals) != 2 or not all(0.0 <= v <= 1.0 for v in vals):
        raise ValueError(
            f"query {spec!r}: expected 'cls' or 'row,col' as fractions of the image in [0, 1], e.g. 0.5,0.5"
        )
    return vals


def query_cell(query: tuple[float, float], map_size: tuple[int, int]) -> tuple[int, int]:
    """Fractions (row, col) -> the (row, col) cell of an H x W map."""
    h, w = map_size
    return min(int(query[0] * h), h - 1), min(int(query[1] * w), w - 1)


class QueryMapHook:
    """Attention hook keeping, for each query, its head-averaged row scattered onto the map."""

    def __init__(self, queries: Sequence[QuerySpec], map_sizes=None):
        self.queries = [parse_query(q) if not isinstance(q, tuple) and q != "cls" else q for q in queries]
        self.map_sizes = map_sizes or {}
        self.maps: Optional[torch.Tensor] = None  # [B, Q, H, W]
        self.prefix_weight: Optional[torch.Tensor] = None  # [B, Q]
        self.heads = 0
        self.map_size: Optional[tuple[int, int]] = None
        self.layer_name = ""

    def __call__(self, rec: AttentionRecord) -> None:
        layout = token_layout(rec, self.map_sizes.get(rec.name))
        w = rec.weights.detach()
        g, (hm, wm) = layout.num_groups, layout.map_size
        b, h, nq, nk = w.shape[0] // g, w.shape[1], w.shape[-2], w.shape[-1]
        w = w.view(b, g, h, nq, nk)
        if self.maps is None:
            self.maps = w.new_zeros(b, len(self.queries), hm * wm)
            self.prefix_weight = w.new_zeros(b, len(self.queries))
            self.map_size, self.layer_name = (hm, wm), rec.name
        coords, grid = layout.coords.to(w.device), layout.grid.to(w.device)
        kcoords, kgrid = layout.key_coords.to(w.device), layout.key_grid.to(w.device)
        p, s = layout.num_prefix_tokens, layout.key_cell
        # every map cell a key covers (s x s cells for PVT's reduced keys), sharing its weight
        off = torch.stack(torch.meshgrid(torch.arange(s), torch.arange(s), indexing="ij"), -1).view(-1, 2).to(w.device)
        for qi, q in enumerate(self.queries):
            if q == "cls":
                if p == 0:
                    raise ValueError(f"layer {rec.name!r} has no cls token: query 'cls' is not available")
                gi, ti = 0, 0
            else:
                r, c = query_cell(q, (hm, wm))
                hit = (grid & (coords[..., 0] == r) & (coords[..., 1] == c)).nonzero()
                if len(hit) == 0:
                    continue  # this call (e.g. one stripe branch's group set) does not hold the query
                gi, ti = int(hit[0, 0]), int(hit[0, 1])
            row = w[:, gi, :, ti, :].sum(dim=1)  # [B, Nk] summed over heads
            keys = kgrid[gi]
            cells = kcoords[gi, keys][:, None, :] + off[None]  # [K, s*s, 2]
            inside = (cells[..., 0] < hm) & (cells[..., 1] < wm)
            flat = (cells[..., 0] * wm + cells[..., 1]).clamp(max=hm * wm - 1)
            vals = (row[:, keys][:, :, None] / (s * s)) * inside  # [B, K, s*s]
            self.maps[:, qi].index_add_(1, flat.reshape(-1), vals.reshape(b, -1))
            self.prefix_weight[:, qi] += row[:, :p].sum(dim=1)
        self.heads += h

    def result(self) -> dict:
        if self.maps is None:
            raise ValueError("the chosen layer never ran: no attention map recorded")
        hm, wm = self.map_size
        scale = 1.0 / max(1, self.heads)
        return {
            "maps": (self.maps * scale).view(self.maps.shape[0], -1, hm, wm).cpu(),
            "cls_weight": (self.prefix_weight * scale).cpu(),
            "layer": self.layer_name,
        }


def attention_maps(
    model: torch.nn.Module,
    batches: Iterable,
    queries: Sequence[Union[str, QuerySpec]],
    *,
    layer: Union[int, str] = -1,
    progress: bool = True,
    desc: str = "attention maps",
) -> dict:
    """Head-averaged attention maps of ``queries`` in one ``layer`` for every image of ``batches``.

    Returns {"maps": [num_images, Q, H, W], "cls_weight": [num_images, Q], "layer": name,
    "images": [num_images, C, H, W] (the inputs as given)}.
    """
    from .runner import map_sizes_for, run_hooked

    qs = [parse_query(q) if not isinstance(q, tuple) else q for q in queries]
    if not qs:
        raise ValueError("no query given: pass at least one 'cls' or 'row,col'")
    outs, images = [], []
    state = {}

    def per_batch(x, y, chosen):
        if "sizes" not in state:
            state["sizes"] = map_sizes_for(model, x.shape[-2:])
        state["hook"] = QueryMapHook(qs, state["sizes"])
        return state["hook"]

    def after_batch(x, y, out):
        outs.append(state["hook"].result())
        images.append(x.cpu())

    run_hooked(model, batches, per_batch, after_batch, layers=[layer], progress=progress, desc=desc)
    return {
        "maps": torch.cat([o["maps"] for o in outs]),
        "cls_weight": torch.cat([o["cls_weight"] for o in outs]),
        "layer": outs[0]["layer"] if outs else "",
        "images": torch.cat(images) if images else None,
    }


def plot_attention_maps(
    images: torch.Tensor, per_model: dict, query: QuerySpec, path, *, title: Optional[str] = None
) -> None:
    """One row per image, first column the image (query marked), then one column per model with
    the query's map upsampled onto the image and its colour bar (InLine's weights can be negative).

    images: [B, C, H, W] in [0, 1]; per_model: {label: [B, Hm, Wm] maps}.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch.nn.functional as F

    b = images.shape[0]
    cols = 1 + len(per_model)
    fig, axes = plt.subplots(b, cols, figsize=(1.6 * cols + 0.2, 1.6 * b + 0.7), dpi=100, squeeze=False)
    hi, wi = images.shape[-2:]
    show = images.clamp(0, 1)
    marker = None
    if query != "cls" and per_model:
        hm, wm = next(iter(per_model.values())).shape[-2:]
        r, c = query_cell(query, (hm, wm))
        marker = ((c + 0.5) * wi / wm - 0.5, (r + 0.5) * hi / hm - 0.5)  # the query token's centre
    for r in range(b):
        img = show[r].permute(1, 2, 0).numpy()
        gray = img.shape[-1] == 1
        img = img[..., 0] if gray else img
        for c in range(cols):
            ax = axes[r, c]
            ax.imshow(img, cmap="gray" if gray else None)
            ax.set_xticks([])
            ax.set_yticks([])
            if c > 0:
                label = list(per_model)[c - 1]
                m = per_model[label][r][None, None].float()
                m = F.interpolate(m, size=(hi, wi), mode="nearest")[0, 0].numpy()
                shown = ax.imshow(m, cmap="jet", alpha=0.55)
                bar = fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.02)  # each panel its own scale
                bar.ax.tick_params(labelsize=5)
                if r == 0:
                    ax.set_title(label, fontsize=8)
            elif r == 0:
                ax.set_title("input", fontsize=8)
            if marker is not None:
                ax.plot([marker[0]], [marker[1]], marker="*", color="white", markeredgecolor="black", markersize=9)
    qname = "cls query" if query == "cls" else f"query at ({query[0]:g}, {query[1]:g})"
    fig.suptitle(title or f"Attention maps, {qname}\n(cf. paper Fig. 4)", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
