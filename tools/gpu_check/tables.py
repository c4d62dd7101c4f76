"""The check's Markdown tables, all through one writer (:func:`markdown`)."""

from __future__ import annotations

from typing import Sequence

from inline_attn.bench.report import format_table


def markdown(rows: Sequence[dict], columns: Sequence[tuple[str, str, str]]) -> str:
    """``rows`` as a Markdown table; ``columns``: (key, header, format spec). A ``|`` inside a cell
    would split it, so it is written as ``/``."""
    clean = [{k: v.replace("|", "/") if isinstance(v, str) else v for k, v in r.items()} for r in rows]
    return format_table(clean, columns, markdown=True)
