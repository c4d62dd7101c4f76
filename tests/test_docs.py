"""Every code block in README.md and docs/*.md runs as written, or says why it is not run.

A block's info string gives its language and, for blocks this test does not execute, its class:

- ```` ```python ````: executed here, each block on its own, in a fresh namespace and an empty
  working folder; ```` ```python slow ```` ones only under ``INLINE_ATTN_DOCS_SLOW=1``
  (``make test-docs-slow``). Downloads of the authors' weights are served from a stand-in: a
  randomly initialised checkpoint of the model in the authors' format, so the snippet's code runs
  whole without a network.
- ```` ```bash run ````: executed with bash in an empty folder, ``inline-attn`` being this checkout.
- ```` ```bash data ```` (needs a dataset or a checkpoint that is not here), ``gpu`` (needs an
  NVIDIA GPU), ``long`` (minutes to hours), ``setup`` (installs or builds): not executed, but each
  ``inline-attn`` command in them is parsed by the command's own parser, so a renamed or dropped
  flag fails here.
- ```` ```text ````: a layout, a synopsis or output; not code.

A block without a language, or a shell block without a class, fails: each block is classified once.
The user docs also carry no narration of the project's history (:data:`NARRATION`).
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import stat
import subprocess
import sys

import pytest
import torch

import inline_attn
from inline_attn.cli import build_parser
from inline_attn.models import weights

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = pathlib.Path(inline_attn.__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("bash", "sh")
NOT_RUN = ("data", "gpu", "long", "setup")

# phrases that tell the project's history instead of what holds now (the code review's pattern)
NARRATION = ("fixed in", "no longer", "It was ", "not yet run", "When a GPU is lent", "A GPU session would")


def blocks() -> list[tuple[str, str, list[str], str]]:
    """(id "file:line", language, class words, code) of every fenced block."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in re.finditer(r"^```([^\n`]*)\n(.*?)^```", text, re.M | re.S):
            line = text.count("\n", 0, m.start()) + 1
            info = m.group(1).split()
            found.append((f"{path.relative_to(ROOT)}:{line}", info[0] if info else "", info[1:], m.group(2)))
    return found


BLOCKS = blocks()


def by_language(*languages):
    return [pytest.param(b, id=b[0]) for b in BLOCKS if b[1] in languages]


@pytest.mark.parametrize("block", [pytest.param(b, id=b[0]) for b in BLOCKS])
def test_every_block_is_classified(block):
    where, language, words, _ = block
    assert language in ("python", "text", *SHELL), f"{where}: give the block a language (python, bash or text)"
    if language in SHELL:
        assert set(words) & {"run", *NOT_RUN}, f"{where}: a shell block says run or why not ({', '.join(NOT_RUN)})"


def _fake_download(url, target, sha256, progress):
    """The stand-in for the authors' server: a randomly initialised checkpoint of the model the
    cached file is named after, in the authors' format ({"model": state_dict})."""
    name = pathlib.Path(target).stem
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": inline_attn.create_model(name).state_dict()}, target)


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """An empty working folder, torch.hub's cache in it, downloads served by the stand-in."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.setattr(weights, "_download", _fake_download)
    return tmp_path


@pytest.mark.parametrize("block", by_language("python"))
def test_python_blocks_run(block, scratch):
    where, _, words, code = block
    if "slow" in words and os.environ.get("INLINE_ATTN_DOCS_SLOW") != "1":
        pytest.skip("a slow snippet: `make test-docs-slow` runs it")
    torch.manual_seed(0)
    exec(compile(code, where, "exec"), {"__name__": "__docs__"})


def _commands(code: str) -> list[list[str]]:
    """The ``inline-attn`` command lines of a shell block (continuations joined, comments dropped,
    variables of ``for`` loops and ``NAME=value`` lines replaced by their first value), as argument
    lists; ``-m inline_attn.cli`` under torchrun counts too."""
    out, values = [], {}
    for line in code.replace("\\\n", " ").splitlines():
        for name, value in re.findall(r"(?:^|\s)for (\w+) in (\S+)", line) + re.findall(r"^(\w+)=(\S+)$", line):
            values[name] = value  # a loop's first value, an assignment's value
        line = re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), line)
        words = shlex.split(line, comments=True)
        for i, w in enumerate(words):
            starts = i == 0 or words[i - 1] in ("&&", "||", ";", "|", "do", "then", "time")
            if (w == "inline-attn" and starts) or (w == "inline_attn.cli" and i and words[i - 1] == "-m"):
                out.append(words[i + 1 :])
                break
    return out


@pytest.mark.parametrize("block", by_language(*SHELL))
def test_shell_commands_parse(block):
    where, _, _, code = block
    for argv in _commands(code):
        try:
            build_parser().parse_args(argv)
        except SystemExit as e:
            raise AssertionError(f"{where}: `inline-attn {shlex.join(argv)}` does not parse") from e


@pytest.fixture
def command_on_path(tmp_path):
    """A PATH whose ``inline-attn`` is this checkout's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "inline-attn"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH={SRC} exec {sys.executable} -m inline_attn.cli "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(SRC)}


@pytest.mark.parametrize("block", [b for b in by_language(*SHELL) if "run" in b.values[0][2]])
def test_cheap_shell_blocks_run(block, command_on_path, tmp_path):
    where, _, _, code = block
    run = subprocess.run(["bash", "-e", "-c", code], cwd=tmp_path, env=command_on_path, capture_output=True, text=True)
    assert run.returncode == 0, f"{where}:\n{run.stdout}\n{run.stderr}"


def test_the_user_docs_narrate_no_history():
    found = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for path in DOCS
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if any(p in line for p in NARRATION)
    ]
    assert not found, "\n".join(found)
