"""Classification's run outputs written by rank 0: the columns of metrics.csv, curves.png."""

from __future__ import annotations

import pathlib

from .._io import atomic_path

__all__ = ["METRIC_COLUMNS", "plot_curves"]

METRIC_COLUMNS = [
    "epoch",
    "step",
    "lr",
    "train_loss",
    "val_loss",
    "val_top1",
    "val_top5",
    "val_top1_ema",
    "epoch_time_s",
    "train_img_s",
]


# the panels of curves.png: (y label, curves as (metrics key, line style, legend label))
_PANELS = (
    ("cross-entropy", (("train_loss", "o-", "train (augmented, soft targets)"), ("val_loss", "s-", "val"))),
    ("accuracy (%)", (("val_top1", "s-", "val top-1"), ("val_top1_ema", "^-", "val top-1 (EMA)"))),
)


def plot_curves(history: list[dict], path: pathlib.Path, title: str = "") -> None:
    """Loss (train, val) and top-1 accuracy per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    ep = [r["epoch"] + 1 for r in history]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (ylabel, curves) in zip(axes, _PANELS):
        for i, (key, style, label) in enumerate(curves):
            if i == 0 or any(r.get(key) is not None for r in history):  # the first always, the others when measured
                ax.plot(ep, [r.get(key) for r in history], style, label=label)
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.legend()
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=100, format="png")
    finally:
        plt.close(fig)
