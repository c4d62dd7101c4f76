"""Run records written by rank 0: a metrics CSV rewritten whole, a JSON summary; and the one
Markdown table writer of every report."""

from __future__ import annotations

import csv
import json
import math
import pathlib
from typing import Iterable, Optional, Sequence

from .._io import atomic_write_text


def write_csv(history: list[dict], path: pathlib.Path, columns: Optional[Sequence[str]] = None) -> None:
    """The whole history, one row per dict (rewritten so a resume never duplicates rows; a
    missing or None value is an empty cell). ``columns`` None: every key of the rows, in the
    order first seen; no rows and no columns give an empty file."""
    if columns is None:
        columns = list(dict.fromkeys(k for row in history for k in row))
    if not columns:
        atomic_write_text(path, "")
        return

    def w(f):
        wr = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        wr.writeheader()
        for row in history:
            wr.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})

    atomic_write_text(path, w)


def write_json(obj: dict, path: pathlib.Path) -> None:
    """``obj`` as indented JSON, atomically (values JSON cannot hold written with ``str``)."""
    atomic_write_text(path, lambda f: json.dump(obj, f, indent=2, default=str))


def nan_to_none(summary: dict) -> dict:
    """The summary with NaN floats as None (JSON null: a metric that could not be computed)."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()}


def markdown_row(cells: Iterable) -> str:
    """One Markdown table line, ``| a | b |`` (an empty cell is ``| |``)."""
    return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"


def markdown_table(rows: Iterable[Sequence], columns: Sequence[str]) -> list[str]:
    """A Markdown table as lines: the ``columns`` header, the rule, then one line per row of cells."""
    return [markdown_row(columns), "|" + "|".join("---" for _ in columns) + "|", *(markdown_row(r) for r in rows)]


class TensorBoard:
    """A run's metrics rows as TensorBoard scalars (x: the step) when tensorboard is installed
    and ``logdir`` is given; otherwise a no-op."""

    def __init__(self, logdir: Optional[pathlib.Path]):
        self.writer = None
        if logdir is None:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception:  # tensorboard not installed: metrics.csv is the record
            return
        self.writer = SummaryWriter(str(logdir))

    def log(self, row: dict) -> None:
        if self.writer is None:
            return
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                self.writer.add_scalar(k, v, row["step"])
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
