"""A comparison counts each setting once: a repeated seed, pattern or variant (which made a mean +-
0.00 over n = 2 of one run) is refused before any training, naming it."""

from __future__ import annotations

import re

import pytest

from inline_attn.cli import main
from inline_attn.runtime.config import check_distinct


@pytest.mark.parametrize(
    "argv, message",
    [
        (["seg", "compare", "--seeds", "0", "1", "0"], r"seeds=\[0, 1, 0\] repeats 0: give each once"),
        (["det", "compare", "--seeds", "3", "3"], r"seeds=\[3, 3\] repeats 3: give each once"),
        (["seg", "compare", "--patterns", "IIII", "SSSS", "IIII"], r"patterns=\['IIII', 'SSSS', 'IIII'\] repeats IIII"),
        (["reproduce", "fmnist", "--variants", "inline", "linear", "inline"], r"variants=\[.*\] repeats inline"),
    ],
)
def test_a_repeated_setting_is_refused_before_any_training(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    assert main(argv + ["--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not out.exists() or not any(p.name != ".lock" for p in out.rglob("*") if p.is_file())


@pytest.mark.parametrize("values", [[0, 1, 2], ["IIII"], ("inline", "linear")])
def test_distinct_settings_pass(values):
    check_distinct("seeds", values)


def test_no_setting_at_all_is_refused():
    with pytest.raises(ValueError, match="seeds is empty"):
        check_distinct("seeds", [])
