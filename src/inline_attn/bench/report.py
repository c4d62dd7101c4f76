"""Benchmark output: a terminal table, CSV and JSON files, and a PNG plot.

A result is ``{"meta": {...}, "rows": [{...}, ...]}``: ``meta`` records the machine, torch
version, dtype, the command line and measured rates; each row is one case. Missing numbers
(a case that ran out of memory) are ``nan`` in the table and CSV and ``NaN`` in the JSON.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import pathlib
import platform
import sys
from typing import Optional, Sequence

import torch

from .._io import save_figure
from ..runtime.report import markdown_table

__all__ = ["format_table", "machine_info", "plot_sweep", "save_result", "threads_label", "write_results"]


def machine_info(device: torch.device | str = "cpu") -> dict:
    """Machine, library versions and thread count, for the record."""
    dev = torch.device(device)
    cpu = platform.processor() or platform.machine()
    try:  # the CPU model name, where Linux tells it
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    info = {
        "finished_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "device": str(dev),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "command": " ".join(["inline-attn"] + sys.argv[1:]) if sys.argv and "inline-attn" in sys.argv[0] else None,
    }
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(dev)
    return info


def _fmt(v, spec: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else format(v, spec)
    return str(v)


def format_table(rows: Sequence[dict], columns: Sequence[tuple[str, str, str]], *, markdown: bool = False) -> str:
    """Rows as an aligned text table (or a Markdown table); ``columns``: (key, header, format spec)."""
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        cells.append([_fmt(r.get(k), spec) for k, _, spec in columns])
    if markdown:
        return "\n".join(markdown_table(cells[1:], cells[0]))
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_results(result: dict, out_dir: str | os.PathLike, stem: str) -> dict[str, pathlib.Path]:
    """Write ``<stem>.json`` (meta + rows) and ``<stem>.csv`` (rows) under ``out_dir``."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "csv": out / f"{stem}.csv"}
    with open(paths["json"], "w") as f:
        json.dump(result, f, indent=1, default=str)
    rows = result["rows"]
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(paths["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in keys})
    return paths


def _base_and_variant(name: str) -> tuple[str, str]:
    """ "inline fwd+bwd" -> ("inline", "fwd+bwd"); "Swin-T" -> ("Swin-T", "")."""
    base, sep, variant = name.rpartition(" ")
    return (base, variant) if sep else (name, "")


def plot_sweep(
    rows: Sequence[dict],
    path: str | os.PathLike,
    *,
    x: str,
    series: str,
    panels: Sequence[tuple[str, str, bool]],
    xlabel: str,
    title: str,
    xticks: Optional[Sequence] = None,
) -> pathlib.Path:
    """One PNG with a panel per metric: ``panels`` = (row key, y label, log scale).

    Each distinct ``row[series]`` is a line over ``row[x]``; nan points (OOM) are left out. A
    series named "base variant" (e.g. "inline fwd+bwd", "InLine-Swin-T eager") takes its base's
    colour and its variant's line style, so many series stay tellable apart; the legend sits
    beside the panels.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r[series] for r in rows))
    parts = {n: _base_and_variant(str(n)) for n in names}
    bases = list(dict.fromkeys(b for b, _ in parts.values()))
    variants = list(dict.fromkeys(v for _, v in parts.values()))
    cmap = plt.get_cmap("tab10" if len(bases) <= 10 else "tab20")
    line_styles = ("-", "--", ":", "-.")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
    for ax, (key, ylabel, log) in zip(axes[0], panels):
        for name in names:
            pts = [(r[x], r.get(key)) for r in rows if r[series] == name]
            pts = [(a, b) for a, b in pts if isinstance(b, (int, float)) and not math.isnan(b)]
            if pts:
                base, variant = parts[name]
                ax.plot(
                    *zip(*pts),
                    marker="o",
                    label=str(name),
                    color=cmap(bases.index(base) % cmap.N),
                    linestyle=line_styles[variants.index(variant) % len(line_styles)],
                )
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        if xticks is not None:
            ax.set_xticks(list(xticks))
            ax.set_xticklabels([str(t) for t in xticks])
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = save_figure(fig, path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def threads_label() -> str:
    """torch's thread count as the plot titles name it: "1 thread", "8 threads"."""
    n = torch.get_num_threads()
    return f"{n} thread" if n == 1 else f"{n} threads"


def save_result(
    result: dict, out_dir: str | os.PathLike, stem: str, *, device: str = "cpu", plot: Optional[dict] = None
) -> dict[str, pathlib.Path]:
    """Record ``device``'s machine in ``result["meta"]``, write ``<stem>.json`` and ``.csv`` and, with
    ``plot`` (:func:`plot_sweep`'s keywords), ``<stem>.png``; returns {"json", "csv"[, "png"]: path}."""
    result["meta"]["machine"] = machine_info(device)
    paths = write_results(result, out_dir, stem)
    if plot is not None:
        paths["png"] = plot_sweep(result["rows"], pathlib.Path(out_dir) / f"{stem}.png", **plot)
    return paths
