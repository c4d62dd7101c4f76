"""``inline-attn analyze ... --kinds``: every attention kind side by side, one table and one PNG per analysis."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch

from inline_attn.analysis import compare_kinds as ck
from inline_attn.analysis.masking import NORMALISATION, renormalize_kept
from inline_attn.cli import main
from inline_attn.layers import ATTENTION_CHOICES, LINEAR_CORES, LinearCore

DEIT = ["img_size=28", "patch_size=7", "embed_dim=16", "depth=1", "num_heads=2", "in_chans=1", "num_classes=10"]


def run(*argv) -> int:
    return main(["analyze", *map(str, argv), "--no-progress"])


@pytest.fixture(scope="module")
def fmnist_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("fmnist")
    rng = np.random.default_rng(0)
    for name, arr in (("images", rng.integers(0, 256, (3, 28, 28))), ("labels", np.arange(3))):
        header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}i", *arr.shape)
        with gzip.open(root / f"t10k-{name}-idx{arr.ndim}-ubyte.gz", "wb") as f:
            f.write(header + arr.astype(np.uint8).tobytes())
    return root


def test_injectivity_across_every_kind_writes_a_table_and_a_png(tmp_path, capsys):
    assert run("injectivity", "--kinds", *ATTENTION_CHOICES, "--out", tmp_path) == 0
    table = (tmp_path / "injectivity_kinds.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()[2:]}
    assert set(rows) == set(ATTENTION_CHOICES)
    # the paper's Fig. 1: ReLU linear attention confuses collinear queries, softmax and InLine do not
    assert "| linear | 1 |" in rows["linear"] and rows["inline"].endswith("| yes |")
    assert rows["softmax"].endswith("| yes |")
    assert (tmp_path / "injectivity_kinds.png").stat().st_size > 0


@pytest.mark.parametrize(
    "analysis,table", [("confusion", "confusion.md"), ("locality", "locality.md"), ("masking", "masking.md")]
)
def test_data_analyses_compare_every_kind_on_tiny_untrained_models(tmp_path, fmnist_dir, analysis, table):
    extra = ["--ks", 3] if analysis == "masking" else []
    args = ["--model", "inline_deit_tiny", "--model-args", *DEIT, "--data", f"fmnist:{fmnist_dir}"]
    assert run(analysis, "--kinds", *ATTENTION_CHOICES, *args, *extra, "--out", tmp_path) == 0
    text = (tmp_path / table).read_text()
    for kind in ATTENTION_CHOICES:
        assert f"| {kind} |" in text, kind
    assert (tmp_path / f"{analysis}.png").stat().st_size > 0
    if analysis == "masking":  # kinds without a row normaliser are named
        assert "hydra (hydra)" in text and "mlla (mlla)" in text


def test_unknown_kinds_list_the_known_ones_and_kinds_need_one_model(tmp_path, capsys):
    assert run("injectivity", "--kinds", "inline", "performer", "--out", tmp_path) == 2
    err = capsys.readouterr().err
    assert "unknown attention kind(s) ['performer']" in err and "'agent'" in err and "'mlla'" in err
    assert run("locality", "--kinds", "inline", "--data", "fmnist", "--out", tmp_path) == 2
    assert "--kinds builds one model per kind from a single --model NAME" in capsys.readouterr().err


def test_a_kind_without_explicit_weights_is_named_with_the_analyses_it_cannot_run(monkeypatch):
    class NoWeights(LinearCore):
        kind = "opaque"

    monkeypatch.setitem(LINEAR_CORES, "opaque", NoWeights)
    monkeypatch.setattr(ck, "ATTENTION_CHOICES", ATTENTION_CHOICES + ("opaque",))
    kinds, message = ck.split_by_weights(["inline", "opaque"], "locality")
    assert kinds == ["inline"]
    assert (
        "['opaque'] form no explicit weights: they cannot run injectivity, confusion, attention-maps, locality, masking"
        in message
    )
    assert all(ck.has_explicit_weights(k) for k in ATTENTION_CHOICES)  # every kind the library has


def test_every_kind_has_a_masking_normalisation_and_a_pattern_letter():
    assert set(NORMALISATION) == set(ATTENTION_CHOICES)
    assert {ck.kind_letter(k) for k in ATTENTION_CHOICES} and ck.kind_pattern("inline_swin_tiny", "polarity") == "PPPP"
    w = torch.rand(1, 2, 3, 5)
    keep = torch.rand(1, 3, 5) > 0.3
    torch.testing.assert_close(renormalize_kept(w, keep, "hydra"), w * keep[:, None])  # zeroed only
    kept = renormalize_kept(w, keep | torch.eye(3, 5, dtype=torch.bool)[None], "agent")
    torch.testing.assert_close(kept.sum(-1), torch.ones(1, 2, 3))
    with pytest.raises(ValueError, match="expected one of .*polarity"):
        renormalize_kept(w, keep, "performer")
