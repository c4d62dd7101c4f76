"""The paper's InLine-vs-softmax comparison at small scale: a demo's recipe with each backbone
attention pattern and several seeds; a table of mean +- std.

``inline-attn seg compare --seeds 0 1 2`` (segmentation: mIoU / mAcc / aAcc) and ``inline-attn det
compare`` (detection: box AP / AP50 / AP75) train ``<output>/<pattern>_s<seed>`` for each pair (a
finished run is reused, an unfinished one resumed), then write the table into ``<output>/report.md``.
"""

from __future__ import annotations

import math
import pathlib
import platform
import time
from typing import Optional, Sequence

import torch

from .._io import atomic_write_text, read_json
from ..dense.det_task import DetTask
from ..dense.seg_task import SegTask
from ..dense.build import DenseTask
from ..runtime.config import check_distinct
from ..runtime.report import markdown_table
from ..runtime.run import train

__all__ = ["PATTERN_NAMES", "compare", "format_table"]

PATTERN_NAMES = {
    "IIII": "InLine (PVT without spatial reduction)",
    "SSSS": "softmax (PVT's spatial-reduction attention)",
    "LLLL": "linear (ReLU kernel)",
}
# per task: the dense task (its config, its training, the three metrics of the table), the table's
# heading and what its numbers are
TASKS = {
    "seg": (SegTask, "InLine vs softmax backbone on the mosaics (the demo's budget)", "mIoU / mAcc / aAcc"),
    "det": (
        DetTask,
        "Detection: InLine vs softmax backbone in FCOS on the mosaics",
        "COCO box AP / AP50 / AP75 (pycocotools)",
    ),
}


REPORT = "report.md"  # the table, in the output folder


def _task(task: str) -> tuple[DenseTask, str, str]:
    if task not in TASKS:
        raise ValueError(f"task {task!r}: expected one of {sorted(TASKS)}")
    cls, title, what = TASKS[task]
    return cls(), title, what


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
    task: str = "seg",
) -> list[dict]:
    """Train every (pattern, seed) with ``config`` (same data, recipe and budget) for ``task``
    ("seg" or "det"); returns one summary per run with ``pattern`` and ``seed`` added."""
    check_distinct("patterns", patterns)
    check_distinct("seeds", seeds)
    dense_task, _, _ = _task(task)
    rows = []
    for pattern in patterns:
        for seed in seeds:
            out = pathlib.Path(output) / f"{pattern}_s{seed}"
            done = out / "summary.json"
            if done.is_file() and read_json(done).get("stopped") is None:
                s = dict(read_json(done), reused=True)
            else:
                cfg = dense_task.config.load(
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
                print(f"{task} compare: pattern {pattern}, seed {seed} -> {out}", flush=True)
                s = train(dense_task, cfg)
            rows.append(dict(s, pattern=pattern, seed=int(seed)))
    return rows


def format_table(
    rows: list[dict], *, command: str, config: str, elapsed_min: Optional[float] = None, task: str = "seg"
) -> str:
    """Markdown: one line per pattern with the task's three metrics (mean +- std over seeds),
    the first one per seed, params and time."""
    dense_task, title, what = _task(task)
    keys = dense_task.metric_keys
    by = {}
    for r in rows:
        by.setdefault(r["pattern"], []).append(r)
    lines = [
        f"## {title}",
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
        f"{what} on the validation mosaics (garments of the Fashion-MNIST test split), "
        "mean +- sample std over seeds; train time per run (depends on the machine's load).",
        "",
    ]
    table = []
    for pattern, rs in by.items():
        rs = sorted(rs, key=lambda r: r["seed"])
        cells = []
        for k in keys:
            m, s = _mean_std([r[k] for r in rs])
            cells.append(f"{m:.2f} +- {s:.2f}")
        per = ", ".join(f"{r[keys[0]]:.2f}" for r in rs)
        minutes, _ = _mean_std([r["train_time_s"] / 60 for r in rs])
        seeds = ", ".join(str(r["seed"]) for r in rs)
        table.append(
            [PATTERN_NAMES.get(pattern, pattern), seeds, *cells, per, f"{rs[0]['params']:,}", f"{minutes:.1f}"]
        )
    columns = ["backbone attention", "seeds", *keys, f"per-seed {keys[0]}", "params", "train time (min)"]
    lines += markdown_table(table, columns)
    return "\n".join(lines) + "\n"


def run(
    config,
    *,
    patterns,
    seeds,
    output,
    command: str,
    overrides=(),
    task="seg",
) -> str:
    """Train and tabulate (:func:`compare`, :func:`format_table`); the table goes into
    ``output/report.md``. Returns the table."""
    t0 = time.time()
    rows = compare(config, patterns=patterns, seeds=seeds, output=output, overrides=overrides, task=task)
    table = format_table(rows, command=command, config=str(config), elapsed_min=(time.time() - t0) / 60, task=task)
    atomic_write_text(pathlib.Path(output) / REPORT, table)
    return table
