"""``inline-attn analyze ... --runs FOLDER``: the analyses across every attention kind on the trained
models of the ablations' part d, here tiny runs of one optimizer step made by the ablation runner
itself (``run_ablations(parts="d")`` on a cut-down copy of configs/ablations/_base.yaml)."""

from __future__ import annotations

import gzip
import json
import pathlib
import shutil
import struct

import numpy as np
import pytest

from inline_attn.cli import main
from inline_attn.experiments import ablations
from inline_attn.experiments.ablations import COMPARED, Budget, part_d_runs, run_ablations, swin_setting
from inline_attn.train.config import configs_dir

TOY = Budget(
    subset=64, val_subset=6, epochs=1, fmnist_epochs=1, fmnist_subset=64, mask_images=4, bench_batch=2, bench_iters=1
)
# the ablation task's model at 16 px (an 8 x 8 token grid in stage 1), width 8: one step per run
TINY = {
    "img_size: 56": "img_size: 16",
    "embed_dim: 24": "embed_dim: 8",
    "depths: [1, 1, 2]": "depths: [1, 1, 1]",
    "num_heads: [1, 2, 4]": "num_heads: [1, 1, 2]",
}


def _write_idx(path, arr: np.ndarray) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}i", *arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


@pytest.fixture(scope="module")
def fmnist(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("fmnist")
    rng = np.random.default_rng(0)
    for split, n in (("train", 64), ("t10k", 6)):
        labels = np.arange(n) % 10
        images = labels[:, None, None] * 25 + rng.integers(0, 20, (n, 28, 28))  # brightness encodes the class
        _write_idx(root / f"{split}-images-idx3-ubyte.gz", images)
        _write_idx(root / f"{split}-labels-idx1-ubyte.gz", labels)
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory, fmnist) -> pathlib.Path:
    """Part d, seed 0, every kind: one optimizer step of a tiny model each (a few seconds in all)."""
    tmp = tmp_path_factory.mktemp("ablations")
    cfg = (configs_dir() / ablations.ABLATION_CONFIG).read_text()
    for old, new in TINY.items():
        assert old in cfg, old
        cfg = cfg.replace(old, new)
    (tmp / "configs" / "ablations").mkdir(parents=True)
    (tmp / "configs" / ablations.ABLATION_CONFIG).write_text(cfg)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INLINE_ATTN_FMNIST", str(fmnist))
        res = run_ablations(
            "full", output=str(tmp / "out"), parts="d", seeds=1, budget=TOY,
            config_dir=str(tmp / "configs"), progress=False,
        )  # fmt: skip
    assert res["trained"] == len(COMPARED) and res["left"] == 0
    return tmp / "out"


def run(*argv) -> int:
    return main(["analyze", *map(str, argv), "--no-progress"])


def _table_rows(path: pathlib.Path) -> dict:
    return {line.split("|")[1].strip(): line for line in path.read_text().splitlines() if line.startswith("| ")}


@pytest.mark.parametrize(
    "analysis,table",
    [
        ("confusion", "confusion.md"),
        ("locality", "locality.md"),
        ("masking", "masking.md"),
        ("injectivity", "injectivity_kinds.md"),
    ],
)
def test_every_analysis_compares_the_trained_part_d_model_of_every_kind(tmp_path, runs, fmnist, analysis, table):
    data = [] if analysis == "injectivity" else ["--data", f"fmnist:{fmnist}"]
    extra = ["--ks", 1] if analysis == "masking" else []  # the last stage's grid is 2 x 2: a 1 x 1 window fits
    assert run(analysis, "--runs", runs, *data, *extra, "--out", tmp_path) == 0
    rows = _table_rows(tmp_path / table)
    assert set(COMPARED) <= set(rows), sorted(rows)
    png = tmp_path / (table.replace(".md", ".png"))
    assert png.stat().st_size > 0
    if analysis == "injectivity":
        # the trained layers' own parameters: ReLU linear attention still confuses collinear queries
        assert "| linear | 1 |" in rows["linear"] and rows["softmax"].endswith("| yes |")
        text = (tmp_path / table).read_text()
        assert "Trained models: one attention layer (layer layers.0.blocks.0.attn of each)" in text
        meta = json.loads((tmp_path / "injectivity_kinds.json").read_text())
    else:
        meta = json.loads((tmp_path / f"{analysis}.json").read_text())
    if analysis == "confusion":
        # InLine's three global layers compare C(64, 2) + C(16, 2) + 2 heads x C(4, 2) query pairs per image
        s = meta["summary"]["inline"]
        assert s["pairs_per_image"] == 2016 + 120 + 12 and s["rate"] == pytest.approx(s["mean"] / 2148)
    # each model is the run folder's checkpoint, rebuilt by the trainer's loader
    ckpts = {m["label"]: m["checkpoint"] for m in meta["models"]}
    assert list(ckpts) == list(COMPARED)
    for kind, path in ckpts.items():
        assert pathlib.Path(path).parent == runs / swin_setting(kind).key / "seed0"


def test_kinds_pick_runs_in_their_order_and_checkpoints_can_be_given_per_kind(tmp_path, runs, fmnist, capsys):
    args = ["--data", f"fmnist:{fmnist}", "--num-images", 2]
    assert run("locality", "--runs", runs, "--kinds", "mlla", "inline", *args, "--out", tmp_path / "a") == 0
    assert list(_table_rows(tmp_path / "a" / "locality.md"))[1:] == ["mlla", "inline"]  # after the header
    folders = [runs / swin_setting(k).key / "seed0" for k in ("agent", "softmax")]
    assert run("locality", "--kinds", "agent", "softmax", "--checkpoint", *folders, *args, "--out", tmp_path / "b") == 0
    assert list(_table_rows(tmp_path / "b" / "locality.md"))[1:] == ["agent", "softmax"]
    # a checkpoint given for another kind than the one it attends with
    assert run("locality", "--kinds", "inline", "--checkpoint", folders[1], *args, "--out", tmp_path / "c") == 2
    assert "is a model of attention kind 'softmax', given for 'inline'" in capsys.readouterr().err
    assert run("locality", "--kinds", "inline", "agent", "--checkpoint", folders[0], *args, "--out", tmp_path) == 2
    assert "one checkpoint per kind, each kind once (got 2 kinds, 1 checkpoints)" in capsys.readouterr().err


def test_missing_kinds_are_named_with_the_command_that_trains_them(tmp_path, runs, capsys):
    part = tmp_path / "part"
    key = swin_setting("inline").key
    shutil.copytree(runs / key / "seed0", part / key / "seed0")
    assert part_d_runs(part, ["inline"]) == {"inline": part / key / "seed0"}
    with pytest.raises(ValueError) as e:
        part_d_runs(part, ["inline", "softmax", "mlla"])
    msg = str(e.value)
    assert "kind(s) ['softmax', 'mlla']" in msg and "softmax-w28/seed0" in msg
    assert f"inline-attn reproduce ablations --parts d --seeds 1 --output {part}" in msg
    with pytest.raises(ValueError, match=r"of seed 2 for kind\(s\) \['inline'\].* --seeds 3 "):
        part_d_runs(part, ["inline"], seed=2)
    # a run stopped before the end (its summary says so) is not a finished run
    summary = part / key / "seed0" / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "stopped": "signal"}))
    with pytest.raises(ValueError, match=r"kind\(s\) \['inline'\]"):
        part_d_runs(part, ["inline"])
    # through the command: every kind is missing from an empty folder; bad flags and kinds
    assert run("locality", "--runs", tmp_path, "--data", "fmnist", "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err
    assert "for kind(s) ['inline', 'softmax', 'linear'," in err and "'mlla']" in err
    assert run("injectivity", "--runs", tmp_path / "nowhere", "--out", tmp_path / "o") == 2
    assert "is not a folder" in capsys.readouterr().err
    assert run("locality", "--runs", runs, "--kinds", "performer", "--data", "fmnist", "--out", tmp_path / "o") == 2
    assert "unknown attention kind(s) ['performer']: part d trains" in capsys.readouterr().err
    assert run("locality", "--runs", runs, "--model", "inline_swin_tiny", "--data", "fmnist", "--out", tmp_path) == 2
    assert "--runs has each kind's trained model: no --model" in capsys.readouterr().err
