"""Report sections in a markdown docs file, between two HTML-comment markers.

Commands that tabulate runs (``reproduce fmnist``, ``reproduce ablations``, ``seg|det compare``)
write into a docs file only when ``--doc`` names one. The file is checked before any training
(:func:`check_doc`), and a section there is replaced only by one that reports at least as many
finished runs, unless the caller asks for it (``--replace-fewer``): a quick or mistyped invocation
never blanks a committed table.
"""

from __future__ import annotations

import argparse
import pathlib
from typing import Callable, Optional, Union

from .._io import atomic_write_text, writable_dir

__all__ = ["add_doc_options", "check_doc", "replace_section", "table_rows"]


def add_doc_options(p: argparse.ArgumentParser) -> None:
    """``--doc`` and ``--replace-fewer``, the same for every command that tabulates runs."""
    p.add_argument("--doc", help="markdown file to write the table into, in its marked section (default: none)")
    p.add_argument(
        "--replace-fewer",
        action="store_true",
        help="replace --doc's section even when it reports more finished runs than this report",
    )


def check_doc(doc: Union[None, str, pathlib.Path], replace_fewer: bool = False) -> Optional[pathlib.Path]:
    """``doc`` as a path, its folder created and writable (ValueError naming it otherwise), or None
    for no doc. Called before the work, so a report is never lost at the last step."""
    if doc is None or str(doc) == "":
        if replace_fewer:
            raise ValueError("--replace-fewer (replace_fewer=True) needs --doc (doc=): there is no section to replace")
        return None
    path = pathlib.Path(doc)
    if path.is_dir():
        raise ValueError(f"--doc {path} is a folder: expected a markdown file")
    writable_dir(path.parent, "--doc's folder")
    return path


def table_rows(section: str) -> list[list[str]]:
    """The cells of each body row of the markdown tables in ``section`` (header and rule left out)."""
    rows, lines = [], section.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|") or line.startswith("|---"):
            continue
        if i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            continue  # a header
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def replace_section(
    path: pathlib.Path,
    block: str,
    begin: str,
    end: str,
    *,
    runs: Callable[[str], int],
    replace_fewer: bool = False,
    new_file: str = "",
) -> None:
    """Put ``block`` (which starts with ``begin`` and ends with ``end``) in place of the section of
    ``path`` between those markers, or append it (to ``new_file`` when ``path`` does not exist).

    ``runs(text)`` counts the finished runs a section reports. A ValueError, and the file left as
    it is, when the section there reports more than ``block`` and ``replace_fewer`` is False.
    """
    text = path.read_text() if path.exists() else new_file
    if begin in text and end in text:
        a, b = text.index(begin), text.index(end) + len(end)
        had, has = runs(text[a:b]), runs(block)
        if has < had and not replace_fewer:
            raise ValueError(
                f"{path}: its section {begin} reports {had} finished runs and this report {has}; the section is "
                "kept (pass --replace-fewer, or replace_fewer=True, to replace it)"
            )
        text = text[:a] + block + text[b:]
    else:
        text = text.rstrip("\n") + ("\n\n" if text.strip() else "") + block + "\n"
    atomic_write_text(path, text)
