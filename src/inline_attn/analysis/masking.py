"""Local masking (paper Table 2): accuracy when each query may not attend to its k x k window.

For every grid query, the keys in its k x k window (image coordinates, clipped at the edges,
the query itself included) are removed from its attention; the control removes the same number
of keys drawn at random among the grid keys of the same call (fresh draws per call, image and
query; shared by the heads). Prefix (cls) queries and keys are never masked. The remaining
weights are renormalised the way each attention kind normalises (the attention of that kind
computed over the kept keys only):

- softmax, linear: ``w'_ij = w_ij / sum_{s kept} w_is`` (for softmax, the same as setting the
  masked logits to -inf);
- InLine: ``w'_ij = w_ij - (sum_{s kept} w_is - 1) / |kept|`` (the subtractive normalisation
  ``phi(q).phi(k_j) - mean_s phi(q).phi(k_s) + 1/N`` over the kept keys);
- the other linear attentions: see :data:`NORMALISATION`.

With ``renormalize=False`` the masked weights are only zeroed. The local residual of InLine is
not part of the attention weights and stays on.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch

from .._io import save_figure
from ..layers.record import AttentionRecord
from .tokens import expand_groups, token_layout, window_mask

MODES = ("none", "local", "random")


# How each kind's rows are normalised, and so how masking renormalises the kept keys: "divide"
# (rows sum to one by a division: softmax, linear attention and the other linear attentions that
# divide by a row sum; for Efficient attention, Agent attention and PolaFormer the division
# stands in for recomputing their normaliser over the kept keys), "subtract" (InLine), "none"
# (no row normaliser a row of weights can show: Hydra's cosines, linear-angular's 1/2 + cos / pi,
# MLLA's RoPE numerator over a RoPE-free denominator; the masked weights are only zeroed).
NORMALISATION = {
    "softmax": "divide",
    "linear": "divide",
    "inline": "subtract",
    "efficient": "divide",
    "relu_msa": "divide",
    "focused": "divide",
    "agent": "divide",
    "polarity": "divide",
    "hydra": "none",
    "angular": "none",
    "mlla": "none",
}


def renormalize_kept(weights: torch.Tensor, keep: torch.Tensor, kind: str) -> torch.Tensor:
    """weights: [BG, h, Nq, Nk], keep: [BG, Nq, Nk] bool -> weights over the kept keys only
    (renormalised as :data:`NORMALISATION` says for ``kind``)."""
    if kind not in NORMALISATION:
        raise ValueError(f"unknown attention kind {kind!r}: expected one of {tuple(NORMALISATION)}")
    keep = keep[:, None].to(weights.dtype)
    w = weights * keep
    s = w.sum(dim=-1, keepdim=True)
    if NORMALISATION[kind] == "none":
        return w
    if NORMALISATION[kind] == "divide":
        # a linear-attention row can be all zero (phi(q) = 0): it stays zero
        return torch.where(s > 0, w / s.clamp_min(torch.finfo(w.dtype).tiny), w)
    n = keep.sum(dim=-1, keepdim=True).clamp_min(1)  # "subtract": InLine
    return (w - (s - 1) / n) * keep


def random_like_window(near: torch.Tensor, grid: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """near: [BG, Nq, Nk] window mask, grid: [BG, Nk] grid keys -> [BG, Nq, Nk] bool with, per
    query, as many random grid keys as its window holds."""
    count = near.sum(dim=-1, keepdim=True)  # [BG, Nq, 1]
    scores = torch.rand(near.shape, generator=generator).to(near.device)
    scores = scores.masked_fill(~grid[:, None, :], 2.0)  # non-grid keys sort last: never drawn
    rank = scores.argsort(dim=-1).argsort(dim=-1)
    return rank < count


class MaskingHook:
    """Attention hook that removes each grid query's k x k window (``mode="local"``) or as many
    random keys (``mode="random"``) from its attention, and renormalises the rest."""

    def __init__(self, mode: str, k: int = 3, *, seed: int = 0, renormalize: bool = True, map_sizes=None):
        if mode not in MODES:
            raise ValueError(f"unknown masking mode {mode!r}: expected one of {MODES}")
        check_odd_window_sizes([k])
        self.mode, self.k, self.renormalize = mode, k, renormalize
        self.generator = torch.Generator().manual_seed(seed)
        self.map_sizes = map_sizes or {}

    def drop_mask(self, rec: AttentionRecord) -> torch.Tensor:
        """[B*G, Nq, Nk] bool: the keys removed from each query's attention."""
        layout = token_layout(rec, self.map_sizes.get(rec.name))
        b = rec.weights.shape[0] // layout.num_groups
        near = expand_groups(window_mask(layout, self.k), b)
        if self.mode == "local":
            drop = near
        elif self.mode == "random":
            drop = random_like_window(near, expand_groups(layout.key_grid, b), self.generator)
        else:
            drop = torch.zeros_like(near)
        return drop.to(rec.weights.device)

    def __call__(self, rec: AttentionRecord) -> Optional[torch.Tensor]:
        if self.mode == "none":
            return None
        keep = ~self.drop_mask(rec)
        w = rec.weights
        if self.renormalize:
            return renormalize_kept(w, keep, rec.kind)
        return w * keep[:, None].to(w.dtype)


def check_odd_window_sizes(ks: Iterable[int], what: str = "k") -> None:
    """Refuse the window sizes in ``ks`` that are not odd positive integers (a k x k window is
    centred on its query), naming them and ``what`` gave them (``--ks``, or a function's ``k``)."""
    bad = [k for k in ks if k < 1 or k % 2 == 0]
    if bad:
        raise ValueError(f"{what} {bad}: window sizes must be odd positive integers (e.g. 3 5 7)")


def check_window_sizes(model: torch.nn.Module, ks: Sequence[int], input_hw, *, layers=None, label=None) -> None:
    """Refuse a window size in ``ks`` wider than the token grid of a layer it would mask.

    The grid of each masked layer (``layers``, as :func:`~inline_attn.layers.record.select_layers`
    takes them; None: all) is its stage's feature map for an input of ``input_hw``. A k x k window
    must fit in the smallest of them (k <= its shorter side): a wider one is clipped to the grid at
    every query, no longer a local neighbourhood, and once k >= 2 * side - 1 it masks every key of
    that grid, each such k repeating the last. Layers of a model without ``feature_info`` are not
    checked (their grid is only known once they run)."""
    from ..layers.record import attention_layers, select_layers
    from .runner import map_sizes_for

    sizes = map_sizes_for(model, input_hw)
    grids = [(min(sizes[name]), name) for _, name, _ in select_layers(attention_layers(model), layers) if name in sizes]
    if not grids:
        return
    side, name = min(grids)
    too_wide = [k for k in ks if k > side]
    if too_wide:
        h, w = sizes[name]
        widest = side if side % 2 else side - 1
        who = f"model {label}: " if label is not None else ""
        raise ValueError(
            f"--ks {too_wide}: {who}layer {name!r} attends over a {h}x{w} token grid (input {input_hw[0]}x"
            f"{input_hw[1]}); a k x k window wider than {side} does not fit in it (clipped at every query): "
            f"expected odd k from 1 to {widest}"
        )


def masked_accuracy(
    model: torch.nn.Module,
    batches: Iterable,
    *,
    ks: Sequence[int] = (3, 5, 7),
    layers=None,
    seed: int = 0,
    renormalize: bool = True,
    progress: bool = True,
    desc: str = "masking",
) -> list[dict]:
    """Top-1 of ``model`` on ``batches`` unmasked, with local k x k windows masked, and with as
    many random keys masked, for each k in ``ks``. One pass over the data per setting.

    Returns rows: {"mask": "none" | "local" | "random", "k", "top1", "images"}. A k wider than a
    masked layer's token grid is refused before the first batch runs (:func:`check_window_sizes`).
    """
    from .runner import map_sizes_for, run_hooked

    settings = [("none", 0)] + [(m, k) for k in ks for m in ("local", "random")]
    rows = []
    for mode, k in settings:
        hook = MaskingHook(mode, k or 1, seed=seed, renormalize=renormalize)
        correct = [0, 0]

        def per_batch(x, y, chosen, hook=hook):
            if not hook.map_sizes:
                if hook.mode == "none":  # the first setting, before its first forward: refused before any run
                    check_window_sizes(model, ks, tuple(x.shape[-2:]), layers=layers)
                hook.map_sizes = map_sizes_for(model, x.shape[-2:])
            return hook

        def after_batch(x, y, out, correct=correct):
            correct[0] += int((out.argmax(dim=-1).cpu() == y.cpu()).sum())
            correct[1] += int(y.shape[0])

        run_hooked(
            model,
            batches,
            per_batch,
            after_batch,
            layers=layers,
            progress=progress,
            desc=f"{desc} {mode}{'' if mode == 'none' else f' {k}x{k}'}",
        )
        rows.append({"mask": mode, "k": k, "top1": 100.0 * correct[0] / max(1, correct[1]), "images": correct[1]})
    return rows


def plot_masking(per_model: dict, ks: Sequence[int], path, *, title: Optional[str] = None) -> None:
    """Top-1 against k: solid = local k x k window masked, dashed = as many random keys masked,
    dotted horizontal = unmasked; one colour per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len(per_model) > 4:  # one panel per model: 2 x N lines on one axes are unreadable
        return _plot_masking_panels(plt, per_model, ks, path, title)
    fig, ax = plt.subplots(figsize=(5.5, 3.4), dpi=100)
    for ci, (label, rows) in enumerate(per_model.items()):
        color = f"C{ci}"
        by = {(r["mask"], r["k"]): r["top1"] for r in rows}
        ax.plot(list(ks), [by[("local", k)] for k in ks], marker="o", color=color, label=f"{label}: local")
        ax.plot(list(ks), [by[("random", k)] for k in ks], marker="s", ls="--", color=color, label=f"{label}: random")
        ax.axhline(by[("none", 0)], ls=":", color=color, lw=1)
    ax.set_xticks(list(ks))
    ax.set_xticklabels([f"{k}x{k}" for k in ks])
    ax.set_xlabel("masked window (or as many random keys)")
    ax.set_ylabel("top-1 (%)")
    ax.set_title(title or "Masking local vs random keys (cf. paper Table 2)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _plot_masking_panels(plt, per_model: dict, ks: Sequence[int], path, title: Optional[str]) -> None:
    """:func:`plot_masking` for many models: one panel each, a shared y axis."""
    n = len(per_model)
    cols = min(4, n)
    rows_n = -(-n // cols)
    fig, axes = plt.subplots(
        rows_n, cols, figsize=(2.3 * cols, 1.9 * rows_n + 0.5), dpi=100, sharey=True, squeeze=False
    )
    for ax, (label, rows) in zip(axes.flat, per_model.items()):
        by = {(r["mask"], r["k"]): r["top1"] for r in rows}
        ax.plot(list(ks), [by[("local", k)] for k in ks], marker="o", color="C3", label="local")
        ax.plot(list(ks), [by[("random", k)] for k in ks], marker="s", ls="--", color="C0", label="random")
        ax.axhline(by[("none", 0)], ls=":", color="k", lw=1, label="unmasked")
        ax.set_title(label, fontsize=8)
        ax.set_xticks(list(ks))
        ax.set_xticklabels([f"{k}x{k}" for k in ks], fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("top-1 (%)", fontsize=8)
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(title or "Masking the local k x k window vs as many random keys (cf. paper Table 2)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
