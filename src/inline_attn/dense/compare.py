"""The paper's InLine-vs-softmax comparison at small scale: the demo's recipe with each backbone
attention pattern and several seeds; a table of mean +- std written into a markdown file.

``inline-attn seg compare --seeds 0 1 2`` trains ``<output>/<pattern>_s<seed>`` for each pair
(a finished run is reused, an unfinished one resumed), then writes the table between the markers
``<!-- seg-compare:begin -->`` / ``<!-- seg-compare:end -->`` of ``--doc``.
"""

from __future__ import annotations

import json
import math
import pathlib
import platform
import time
from typing import Optional, Sequence

import torch

from .config import load_seg_config

__all__ = ["PATTERN_NAMES", "compare", "format_table"]

PATTERN_NAMES = {
    "IIII": "InLine (PVT without spatial reduction)",
    "SSSS": "softmax (PVT's spatial-reduction attention)",
    "LLLL": "linear (ReLU kernel)",
}
BEGIN, END = "<!-- seg-compare:begin -->", "<!-- seg-compare:end -->"


def _mean_std(xs: Sequence[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0)


def compare(
    config,
    *,
    patterns: Sequence[str] = ("IIII", "SSSS"),
    seeds: Sequence[int] = (0, 1, 2),
    output="runs/seg_compare",
    overrides=(),
    progress: bool = True,
) -> list[dict]:
    """Train every (pattern, seed) with ``config`` (same data, recipe and budget); returns one
    summary per run with ``pattern`` and ``seed`` added."""
    from .engine import train_seg

    rows = []
    for pattern in patterns:
        for seed in seeds:
            out = pathlib.Path(output) / f"{pattern}_s{seed}"
            done = out / "summary.json"
            if done.is_file() and json.loads(done.read_text()).get("stopped") is None:
                s = dict(json.loads(done.read_text()), reused=True)
            else:
                cfg = load_seg_config(
                    config,
                    [("train.progress", progress)]
                    + list(overrides)
                    + [
                        ("model.backbone_kwargs.pattern", pattern),
                        ("train.seed", int(seed)),
                        ("train.output", str(out)),
                        ("train.resume", "auto"),
                    ],
                )
                print(f"seg compare: pattern {pattern}, seed {seed} -> {out}", flush=True)
                s = train_seg(cfg)
            rows.append(dict(s, pattern=pattern, seed=int(seed)))
    return rows


def format_table(rows: list[dict], *, command: str, config: str, elapsed_min: Optional[float] = None) -> str:
    """Markdown: one line per pattern with mIoU / mAcc / aAcc mean +- std over seeds, params and time."""
    by = {}
    for r in rows:
        by.setdefault(r["pattern"], []).append(r)
    lines = [
        BEGIN,
        "## InLine vs softmax backbone on the mosaics (the demo's budget)",
        "",
        f"Command: `{command}` (config `{config}`; every run the same data, recipe and iterations; only the "
        f"backbone's attention and the seed change).",
        f"Measured on {platform.machine()}, torch {torch.__version__}"
        + (f"; the command ran {elapsed_min:.1f} min" if elapsed_min is not None else "")
        + (
            f" ({sum(bool(r.get('reused')) for r in rows)} of {len(rows)} runs reused from an earlier invocation "
            f"with the same output folder)"
            if any(r.get("reused") for r in rows)
            else ""
        )
        + ". "
        "mIoU / mAcc / aAcc on the validation mosaics (garments of the Fashion-MNIST test split), "
        "mean +- sample std over seeds; train time per run (depends on the machine's load).",
        "",
        "| backbone attention | seeds | mIoU | mAcc | aAcc | per-seed mIoU | params | train time (min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for pattern, rs in by.items():
        rs = sorted(rs, key=lambda r: r["seed"])
        cells = []
        for k in ("mIoU", "mAcc", "aAcc"):
            m, s = _mean_std([r[k] for r in rs])
            cells.append(f"{m:.2f} +- {s:.2f}")
        per = ", ".join(f"{r['mIoU']:.2f}" for r in rs)
        t, _ = _mean_std([r["train_time_s"] / 60 for r in rs])
        lines.append(
            f"| {PATTERN_NAMES.get(pattern, pattern)} | {', '.join(str(r['seed']) for r in rs)} | "
            + " | ".join(cells)
            + f" | {per} | {rs[0]['params']:,} | {t:.1f} |"
        )
    lines.append(END)
    return "\n".join(lines)


def write_table(doc, table: str) -> pathlib.Path:
    """Replace the marked block of ``doc`` with ``table`` (appended when the markers are absent)."""
    doc = pathlib.Path(doc)
    text = doc.read_text() if doc.is_file() else ""
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + table + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip() + ("\n\n" if text else "") + table + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    return doc


def run(config, *, patterns, seeds, output, doc: Optional[str], command: str, overrides=()) -> str:
    t0 = time.time()
    rows = compare(config, patterns=patterns, seeds=seeds, output=output, overrides=overrides)
    table = format_table(rows, command=command, config=str(config), elapsed_min=(time.time() - t0) / 60)
    if doc:
        write_table(doc, table)
    return table
