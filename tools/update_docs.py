"""Put a finished command's report into its marked section of a docs file.

``inline-attn reproduce fmnist``, ``reproduce ablations`` and ``seg|det compare`` write their report
into their own output folder (``OUTPUT/report.md``; the ablations' figure in ``OUTPUT/figures/``).
This tool copies such a report into the repository's docs, between two HTML-comment markers::

    PYTHONPATH=src python -m tools.update_docs fmnist runs/fmnist docs/reproduction.md
    PYTHONPATH=src python -m tools.update_docs ablations runs/ablations/quick docs/reproduction.md
    PYTHONPATH=src python -m tools.update_docs seg-compare runs/seg_compare docs/dense.md

The section is replaced in place (appended when the file has none; other text stays), but never by
a report of fewer finished runs than the section holds unless ``--replace-fewer`` is given: a
quick or mistyped invocation never blanks a committed table.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shutil
import sys
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from tools.files import atomic_write_text

REPORT = "report.md"  # the file every tabulating command writes into its output folder


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


def fmnist_runs(section: str) -> int:
    """Finished runs a Fashion-MNIST section reports: its table's rows, one per variant."""
    return len(table_rows(section))


def ablation_runs(section: str) -> int:
    """Finished runs an ablation section reports (its "Runs finished: N"; 0 without one)."""
    m = re.search(r"Runs finished: (\d+)", section)
    return int(m.group(1)) if m else 0


def compare_runs(section: str) -> int:
    """Finished runs a compare section reports: the seeds listed in its rows' second column."""
    return sum(len(row[1].split(",")) for row in table_rows(section) if len(row) > 1)


@dataclass(frozen=True)
class Section:
    """A kind of marked section: its marker name, how to count the runs it reports, and the text
    of a docs file that does not exist yet."""

    marker: str
    runs: Callable[[str], int]
    new_file: str = ""

    def markers(self, variant: str = "") -> tuple[str, str]:
        """``<!-- NAME:begin[ VARIANT] -->`` and its ``end``."""
        tail = f" {variant}" if variant else ""
        return f"<!-- {self.marker}:begin{tail} -->", f"<!-- {self.marker}:end{tail} -->"


SECTIONS = {
    "fmnist": Section("fmnist-table", fmnist_runs, "# Reproduction\n\n"),
    "ablations": Section("ablations", ablation_runs, "# Reproduction\n\n"),  # one section per preset
    "seg-compare": Section("seg-compare", compare_runs),
    "det-compare": Section("det-compare", compare_runs),
}


def replace_section(path, report: str, kind: str, variant: str = "", *, replace_fewer: bool = False) -> pathlib.Path:
    """Put ``report`` between the markers of ``kind`` (and ``variant``: the ablations' preset) in
    the markdown file ``path``, in place of what is there, or appended (to the kind's new-file text
    when ``path`` does not exist). A ValueError, and the file left as it is, when the section there
    reports more finished runs than ``report`` and ``replace_fewer`` is False."""
    if kind not in SECTIONS:
        raise ValueError(f"unknown section kind {kind!r}: expected one of {sorted(SECTIONS)}")
    section = SECTIONS[kind]
    begin, end = section.markers(variant)
    path = pathlib.Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder: expected a markdown file")
    block = f"{begin}\n{report.rstrip(chr(10))}\n{end}"
    text = path.read_text() if path.exists() else section.new_file
    if begin in text and end in text:
        a, b = text.index(begin), text.index(end) + len(end)
        had, has = section.runs(text[a:b]), section.runs(block)
        if has < had and not replace_fewer:
            raise ValueError(
                f"{path}: its section {begin} reports {had} finished runs and this report {has}; the section is "
                "kept (pass --replace-fewer to replace it)"
            )
        text = text[:a] + block + text[b:]
    else:
        text = text.rstrip("\n") + ("\n\n" if text.strip() else "") + block + "\n"
    return atomic_write_text(path, text)


def ablation_preset(report: str) -> str:
    """The preset an ablation report was made with, from its heading ``### The PRESET preset``."""
    m = re.search(r"^### The (\S+) preset", report, re.M)
    if not m:
        raise ValueError("the report has no '### The <preset> preset' heading: is it an ablation report?")
    return m.group(1)


def update_doc(kind: str, runs, doc, *, replace_fewer: bool = False) -> pathlib.Path:
    """The report in the output folder ``runs`` (``runs/report.md``) into ``doc``'s section of
    ``kind``; for the ablations also their figures, into ``figures/`` beside ``doc``. Returns ``doc``."""
    report_path = pathlib.Path(runs) / REPORT
    if not report_path.is_file():
        raise ValueError(f"{report_path} not found: is {runs} the --output of a finished command?")
    report = report_path.read_text()
    variant = ablation_preset(report) if kind == "ablations" else ""
    doc = replace_section(doc, report, kind, variant, replace_fewer=replace_fewer)
    if kind == "ablations":
        for png in sorted((pathlib.Path(runs) / "figures").glob("*.png")):
            (doc.parent / "figures").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(png, doc.parent / "figures" / png.name)
    return doc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.update_docs", description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=sorted(SECTIONS), help="the command whose report it is")
    p.add_argument("runs", help="that command's --output folder (holding report.md)")
    p.add_argument("doc", help="the markdown file whose marked section the report replaces")
    p.add_argument(
        "--replace-fewer", action="store_true", help="replace the section even when it reports more finished runs"
    )
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        doc = update_doc(args.kind, args.runs, args.doc, replace_fewer=args.replace_fewer)
    except (ValueError, OSError) as err:
        print(f"update_docs: {err}", file=sys.stderr)
        return 2
    print(f"{args.kind} report of {args.runs} written into {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
