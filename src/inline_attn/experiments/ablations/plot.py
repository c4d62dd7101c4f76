"""Part f's figure: accuracy against inference time of every setting (cf. the paper's Fig. 6a)."""

from __future__ import annotations

import math
import pathlib
from typing import Optional

from ..._io import save_figure
from .settings import NAMES
from .verdicts import mean_std


def plot_accuracy_vs_runtime(results: dict, bench: dict, folder: pathlib.Path, preset: str) -> Optional[str]:
    """Top-1 (mean ± std over seeds) against inference ms per image, one point per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = []
    for key, rs in results.items():
        ips = bench.get(key, {}).get("infer_img_s")
        if ips and not key.startswith("fmnist-"):
            m, s, _ = mean_std([r["top1"] for r in rs])
            if math.isnan(m):  # every seed diverged
                continue
            pts.append((1000.0 / ips, m, 0.0 if math.isnan(s) else s, rs[0]["kind"], rs[0]["label"]))
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    kinds = sorted({p[3] for p in pts})
    colours, markers = plt.get_cmap("tab20"), "os^Dv<>P"  # eleven kinds: more than the default 10 colours
    for ci, kind in enumerate(kinds):
        sel = [p for p in pts if p[3] == kind]
        ax.errorbar([p[0] for p in sel], [p[1] for p in sel], yerr=[p[2] for p in sel], fmt=markers[ci % len(markers)],
                    color=colours(ci % 20), label=NAMES[kind], capsize=3)  # fmt: skip
    ax.set_xlabel("inference time (ms per image, one thread)")
    ax.set_ylabel("top-1 (%)")
    ax.set_title("Accuracy vs runtime of every setting (cf. paper Fig. 6a)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ablations_{preset}_fig6a.png"
    save_figure(fig, path)
    plt.close(fig)
    return str(path)
