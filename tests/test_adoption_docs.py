"""docs/adoption.md's Python blocks run as written, and its worked example runs (a tiny budget)."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

from inline_attn.data.fmnist import fmnist_dir

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
BLOCKS = re.findall(r"```python\n(.*?)```", (DOCS / "adoption.md").read_text(), re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_runs(index):
    exec(compile(BLOCKS[index], f"docs/adoption.md block {index}", "exec"), {"__name__": "__docs__"})


@pytest.mark.skipif(not fmnist_dir().is_dir(), reason="Fashion-MNIST (dataset-fashion-mnist) is not installed")
def test_worked_example_runs_on_a_tiny_budget(capsys):
    spec = importlib.util.spec_from_file_location("convert_fmnist", DOCS / "examples" / "convert_fmnist.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rows = example.main(
        ["--pretrain-epochs", "1", "--finetune-epochs", "1", "--train-images", "128", "--test-images", "100"]
    )
    assert [epochs for _, epochs, _ in rows] == [1, 1, 2, 2, 2]
    assert all(0 <= acc <= 100 for _, _, acc in rows)
    assert "| softmax converted to InLine, fine-tuned | 2 |" in capsys.readouterr().out
