"""The results folder of a check, kept within what a GPU lease returns.

A lease returns at most :data:`MAX_FILES` files of at most :data:`MAX_FILE_BYTES` each, no deeper
than :data:`MAX_DEPTH` folders, named in letters, digits, ``.``, ``_`` and ``-``. So the check
writes only the files of :data:`FILES`, flat: logs are capped at :data:`LOG_BYTES` (head and tail
kept), and checkpoints and training runs stay in a scratch folder outside it.
:func:`limit_problems` says what in a folder would not come back.
"""

from __future__ import annotations

import json
import pathlib
import re

from .summary import render_summary

MAX_FILES = 8
MAX_FILE_BYTES = 16 * 2**20
MAX_DEPTH = 2  # folders under the results folder: $OUT/a/b/file comes back, $OUT/a/b/c/file does not
LOG_BYTES = 2 * 2**20
# every file a check may write; one less than MAX_FILES, so a lease's own file fits beside them
FILES = ("summary.md", "gpu_check.json", "tests.log", "profile.txt", "errors.txt", "triton_tuning.json", "ncu.csv")
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors", ".pkl", ".npz")
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def limit_problems(folder: pathlib.Path) -> list[str]:
    """What in ``folder`` would not come back from a lease, or should never be packed: too many
    files, a file over 16 MB, a folder too deep, a name with other characters, a checkpoint."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    problems = []
    if len(files) > MAX_FILES:
        problems.append(f"{len(files)} files, more than the {MAX_FILES} a lease returns")
    for p in files:
        rel = p.relative_to(folder)
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            problems.append(f"{rel}: {size / 2**20:.1f} MB, over the {MAX_FILE_BYTES // 2**20} MB a file may have")
        if len(rel.parts) - 1 > MAX_DEPTH:
            problems.append(f"{rel}: {len(rel.parts) - 1} folders deep, more than {MAX_DEPTH}")
        if not all(_NAME.match(part) for part in rel.parts):
            problems.append(f"{rel}: a name with characters other than letters, digits, '.', '_' and '-'")
        if p.suffix in CHECKPOINT_SUFFIXES:
            problems.append(f"{rel}: a checkpoint; the results never hold one")
    return problems


def cap_log(path: pathlib.Path, max_bytes: int = LOG_BYTES) -> None:
    """Cut ``path`` to ``max_bytes``: its first and last halves, with a line saying how much was left out."""
    if not path.is_file() or path.stat().st_size <= max_bytes:
        return
    data = path.read_bytes()
    half = max_bytes // 2
    cut = len(data) - 2 * half
    path.write_bytes(data[:half] + f"\n[... {cut} bytes left out ...]\n".encode() + data[-half:])


def append_error(out: pathlib.Path, where: str, text: str) -> None:
    """Keep a step's or part's traceback in ``errors.txt`` (one file for all of them), capped."""
    path = out / "errors.txt"
    with open(path, "a") as fh:
        fh.write(f"===== {where}\n{text.rstrip()}\n\n")
    cap_log(path)


def save(out: pathlib.Path, env: dict, results: dict, argv: list[str]) -> str:
    """Write ``summary.md`` and ``gpu_check.json`` for the steps so far; returns the summary."""
    text = render_summary(env, results, argv)
    (out / "summary.md").write_text(text)
    record = {"env": env, "argv": argv, "results": {k: _without_tables(v) for k, v in results.items()}}
    (out / "gpu_check.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    return text


def _without_tables(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "table"}
