"""``inline-attn analyze``: every analysis end to end on tiny random models, and bad arguments."""

from __future__ import annotations

import csv
import gzip
import json
import re
import struct

import numpy as np
import pytest
import torch
from PIL import Image

from inline_attn import create_model
from inline_attn.cli import main

DEIT = ["img_size=28", "patch_size=7", "embed_dim=16", "depth=2", "num_heads=2", "in_chans=1", "num_classes=10"]
SWIN = ["img_size=64", "embed_dim=8", "depths=[2,2,2,2]", "num_heads=[1,2,2,4]", "window_size=8", "num_classes=3"]
PVT = [
    "img_size=64",
    "embed_dims=[8,16,24,32]",
    "num_heads=[1,2,3,4]",
    "mlp_ratios=[2,2,2,2]",
    "depths=[1,1,2,1]",
    "pattern=ISIS",
    "num_classes=3",
]
CSWIN = [
    "img_size=64",
    "embed_dim=8",
    "depths=[1,1,1,1]",
    "num_heads=[2,2,2,2]",
    "split_size=[1,2,2,2]",
    "inline_split_size=[16,8,4,2]",
    "num_classes=3",
]


def _write_idx(path, arr: np.ndarray) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}i", *arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


@pytest.fixture(scope="module")
def fmnist_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("fmnist")
    rng = np.random.default_rng(0)
    _write_idx(root / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (6, 28, 28)))
    _write_idx(root / "t10k-labels-idx1-ubyte.gz", np.arange(6) % 10)
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("imgs")
    rng = np.random.default_rng(0)
    for c in ("a", "b", "c"):
        (root / "val" / c).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (70, 80, 3), dtype=np.uint8)).save(root / "val" / c / f"{i}.png")
    return root


def run(*argv) -> int:
    return main(["analyze", *map(str, argv), "--no-progress"])


def test_injectivity_command(tmp_path):
    assert run("injectivity", "--out", tmp_path) == 0
    rows = list(csv.DictReader(open(tmp_path / "injectivity.csv")))
    got = {(r["queries"], r["attention"]): int(r["distinct_rows"]) for r in rows}
    assert got[("collinear", "linear_relu")] == 1 and got[("collinear", "inline")] == 4
    assert (tmp_path / "injectivity.png").stat().st_size > 0 and (tmp_path / "injectivity.json").exists()


def test_python_callers_get_the_commands_files(tmp_path, fmnist_dir):
    from inline_attn.analysis import load_images, load_models, write_injectivity, write_masking

    assert run("injectivity", "--out", tmp_path / "cli") == 0
    written = write_injectivity(tmp_path / "py")  # the command's defaults: seed 0, rtol 1e-3
    assert [p.name for p in written] == ["injectivity.csv", "injectivity.json", "injectivity.png"]
    for p in written[:2]:
        assert p.read_bytes() == (tmp_path / "cli" / p.name).read_bytes()
    models = load_models(["inline_deit_tiny"], model_args=_kwargs(DEIT))
    images = load_images(f"fmnist:{fmnist_dir}", num_images=2, img_size=28)
    out = tmp_path / "mask"
    written = write_masking(models, images, out, ks=(3,), progress=False)
    assert [p.name for p in written] == ["masking.csv", "masking.json", "masking.md", "masking.png"]
    assert all(p.stat().st_size > 0 for p in written)
    meta = json.loads(written[1].read_text())
    assert meta["analysis"] == "masking" and meta["images"] == 2 and meta["models"][0]["name"] == "inline_deit_tiny"


def _kwargs(args) -> dict:
    import yaml

    return {k: yaml.safe_load(v) for k, v in (a.split("=") for a in args)}


def test_two_models_and_checkpoints(tmp_path, fmnist_dir, capsys):
    lin = create_model("inline_deit_tiny", **_kwargs(DEIT), pattern="L")
    ck = tmp_path / "linear.pth"
    torch.save({"model": lin.state_dict()}, ck)
    args = [
        "--model",
        "inline_deit_tiny",
        "inline_deit_tiny",
        "--label",
        "inline",
        "linear",
        "--data",
        f"fmnist:{fmnist_dir}",
        "--out",
        tmp_path,
        "--checkpoint",
        "none",
        ck,
        "--model-args",
        *DEIT,
    ]
    # a linear model's weights do not fit InLine blocks (no local residual): a clear error
    assert run("locality", *args) == 2
    assert "missing keys" in capsys.readouterr().err
    assert run("locality", *args, "pattern=L") == 0  # both built as linear: the checkpoint fits
    rows = list(csv.DictReader(open(tmp_path / "locality.csv")))
    assert [r["model"] for r in rows] == ["inline", "inline", "linear", "linear"]
    assert {r["kind"] for r in rows} == {"linear"}


def test_deit_commands_on_fmnist(tmp_path, fmnist_dir):
    data = f"fmnist:{fmnist_dir}"
    common = ["--model-args", *DEIT, "--data", data, "--batch-size", 4]

    out = tmp_path / "conf"
    assert run("confusion", "--model", "inline_deit_tiny", *common, "--out", out) == 0
    rows = list(csv.DictReader(open(out / "confusion.csv")))
    assert len(rows) == 6 and set(rows[0]) == {"model", "image", "layer0", "layer1", "total"}
    meta = json.load(open(out / "confusion.json"))
    assert meta["images"] == 6 and "rtol" in meta and (out / "confusion.png").exists()

    out = tmp_path / "loc"
    assert run("locality", "--model", "inline_deit_tiny", *common, "--layers", "-1", "--out", out) == 0
    rows = list(csv.DictReader(open(out / "locality.csv")))
    assert [r["name"] for r in rows] == ["blocks.1.attn"]
    assert abs(float(rows[0]["nominal_uniform"]) - 9 / 17) < 1e-9 and (out / "locality.png").exists()

    out = tmp_path / "mask"
    assert run("masking", "--model", "inline_deit_tiny", *common, "--ks", 3, "--out", out) == 0
    rows = list(csv.DictReader(open(out / "masking.csv")))
    assert [(r["mask"], r["k"]) for r in rows] == [("none", "0"), ("local", "3"), ("random", "3")]
    assert "local 3x3" in open(out / "masking.md").read() and (out / "masking.png").exists()

    out = tmp_path / "maps"
    assert (
        run(
            "attention-maps",
            "--model",
            "inline_deit_tiny",
            *common,
            "--queries",
            "0.5,0.5",
            "cls",
            "--num-images",
            2,
            "--out",
            out,
        )
        == 0
    )
    meta = json.load(open(out / "attention_maps.json"))
    assert len(meta["maps"]) == 2 * 2 and np.array(meta["maps"][0]["map"]).shape == (4, 4)
    assert (out / "attention_maps_q0.png").exists() and (out / "attention_maps_q1.png").exists()


def test_windowed_model(tmp_path, folder):
    # Swin with 8 x 8 shifted windows on a 16 x 16 stage-1 map: neighbourhoods via token_coords
    common = ["--model", "inline_swin_tiny", "--model-args", *SWIN, "--data", folder, "--num-images", 2]
    assert run("locality", *common, "--out", tmp_path) == 0
    rows = list(csv.DictReader(open(tmp_path / "locality.csv")))
    assert len(rows) == 8 and all(0.0 <= float(r["locality"]) <= 1.0 + 1e-5 for r in rows)
    assert run("masking", *common, "--ks", 3, "--layers", 1, "--out", tmp_path) == 0
    assert run("attention-maps", *common, "--layers", 1, "--out", tmp_path) == 0
    meta = json.load(open(tmp_path / "attention_maps.json"))
    m = np.array(meta["maps"][0]["map"])
    assert m.shape == (16, 16) and abs(m.sum() - 1.0) < 1e-4  # the whole row lies on the stage map
    rows_, cols_ = np.nonzero(m)  # block 1 shifts by 4: the centre query's window is rows/cols 4..11
    assert len(rows_) == 64 and set(rows_) == set(range(4, 12)) and set(cols_) == set(range(4, 12))


def test_stripe_model(tmp_path, folder):
    common = ["--model", "inline_cswin_tiny", "--model-args", *CSWIN, "--data", folder, "--num-images", 2]
    assert run("confusion", *common, "--layers", "stage3.*", "--out", tmp_path) == 0
    assert run("locality", *common, "--out", tmp_path) == 0
    rows = list(csv.DictReader(open(tmp_path / "locality.csv")))
    assert len(rows) == 5 and all(0.0 <= float(r["locality"]) <= 1.0 + 1e-5 for r in rows)


def test_spatial_reduction_model(tmp_path, folder):
    # PVT with softmax stages (pattern ISIS): keys pooled by the spatial reduction (sr 4, 1)
    common = ["--model", "inline_pvt_tiny", "--model-args", *PVT, "--data", folder, "--num-images", 2]
    assert run("locality", *common, "--out", tmp_path) == 0
    rows = list(csv.DictReader(open(tmp_path / "locality.csv")))
    assert [r["kind"] for r in rows] == ["inline", "softmax", "inline", "inline", "softmax"]
    assert [int(r["num_keys"]) for r in rows] == [256, 4, 16, 16, 4]
    assert run("masking", *common, "--ks", 3, "--layers", 1, "--out", tmp_path) == 0
    assert run("attention-maps", *common, "--layers", 1, "--out", tmp_path) == 0
    m = np.array(json.load(open(tmp_path / "attention_maps.json"))["maps"][0]["map"])
    assert m.shape == (8, 8) and abs(m.sum() - 1.0) < 1e-4


def test_run_folder_gives_model_and_normalisation(tmp_path, fmnist_dir):
    # as the trainer writes it: config.yaml (model kwargs without the data-given in_chans /
    # img_size / num_classes) and last.pth with the training state and the model's full arguments
    kw = _kwargs(DEIT)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    model = create_model("inline_deit_tiny", **kw, pattern="S")
    ckpt = {"model": model.state_dict(), "epoch": 3, "rng": {"numpy": np.random.get_state()}}
    ckpt.update(model_name="inline_deit_tiny", model_kwargs={**kw, "pattern": "S"})
    torch.save(ckpt, run_dir / "last.pth")
    shape_free = {k: v for k, v in kw.items() if k not in ("in_chans", "img_size", "num_classes")}
    (run_dir / "config.yaml").write_text(
        json.dumps(
            {
                "model": {"name": "inline_deit_tiny", "kwargs": {**shape_free, "pattern": "S"}},
                "data": {"dataset": "fmnist", "img_size": None, "mean": None},
            }
        )
    )
    assert run("locality", "--checkpoint", run_dir, "--data", f"fmnist:{fmnist_dir}", "--out", tmp_path) == 0
    meta = json.load(open(tmp_path / "locality.json"))
    assert meta["models"][0]["kwargs"] == {**kw, "pattern": "S"}
    assert [r["kind"] for r in meta["results"]["run"]] == ["softmax", "softmax"]  # label: the folder name

    from inline_attn.analysis import load_model

    lm = load_model(None, run_dir)
    assert lm.mean == (0.2860,) and lm.img_size == (28, 28) and lm.in_chans == 1
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(lm.model(x), model.eval()(x))


def test_bad_arguments(tmp_path, fmnist_dir, capsys):
    with pytest.raises(SystemExit) as e:
        run("entropy", "--model", "inline_deit_tiny")
    assert e.value.code == 2 and "invalid choice: 'entropy'" in capsys.readouterr().err
    common = ["--model", "inline_deit_tiny", "--model-args", *DEIT, "--data", f"fmnist:{fmnist_dir}", "--out", tmp_path]
    assert run("locality", *common, "--layers", 7) == 2
    assert "layer index 7 out of range: the model has 2 attention layers" in capsys.readouterr().err
    assert run("locality", *common, "--layers", "head*") == 2
    assert "no attention layer matches 'head*'" in capsys.readouterr().err
    assert run("attention-maps", *common, "--queries", "centre") == 2
    assert "expected 'cls' or 'row,col'" in capsys.readouterr().err
    assert run("attention-maps", *common, "--images", 0, 50) == 2
    assert "image indices [50] out of range: the data has 6 images" in capsys.readouterr().err
    assert run("masking", *common, "--ks", 4) == 2
    assert "odd positive" in capsys.readouterr().err
    assert run("locality", "--model", "inline_deit_tiny", "--model-args", *DEIT, "--out", tmp_path) == 2
    assert "needs --data" in capsys.readouterr().err
    assert run("locality", *common[:-4], "--data", tmp_path / "missing", "--out", tmp_path) == 2
    assert "expected 'fmnist' or an ImageNet-layout folder" in capsys.readouterr().err
    assert run("locality", "--model", "no_such_model", "--data", "fmnist", "--out", tmp_path) == 2
    assert "unknown model 'no_such_model'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["injectivity", "--data", "fmnist"], "--data is an option of confusion, attention-maps, locality, masking"),
        (["injectivity", "--num-images", 5], "--num-images is an option of confusion, attention-maps, locality"),
        (["injectivity", "--batch-size", 8], "--batch-size is an option of confusion,"),
        (["injectivity", "--ks", 3], "--ks is an option of masking: analyze injectivity does not take it"),
        (["injectivity", "--layers", 0], "--layers picks the layer of trained models"),
        (["injectivity", "--model", "inline_deit_tiny"], "injectivity of fresh layers takes no --model"),
        (["injectivity", "--run-seed", 1], "--run-seed 1 picks the runs of --runs FOLDER"),
        (
            ["injectivity", "--runs", "nowhere", "--model-args", "depth=1"],
            "has each kind.s trained model: no --model/--checkpoint/--label/--model-args",
        ),
        (["confusion", "{common}", "--seed", 3], "--seed is an option of injectivity, masking: analyze confusion"),
        (["confusion", "{common}", "--queries", "cls"], "--queries is an option of attention-maps: analyze confusion"),
        (["locality", "{common}", "--rtol", 0.1], "--rtol is an option of confusion, injectivity: analyze locality"),
        (["masking", "{common}", "--queries", "cls"], "--queries is an option of attention-maps: analyze masking"),
        (["attention-maps", "{common}", "--ks", 3], "--ks is an option of masking: analyze attention-maps"),
        (["confusion", "{common}", "--rtol", -1], "--rtol must be a finite number >= 0, got -1.0"),
        (["confusion", "{common}", "--rtol", "inf"], "--rtol must be a finite number >= 0, got inf"),
        (["masking", "{common}", "--ks", 3, 0, 4], r"--ks \[0, 4\]: window sizes must be odd positive integers"),
        (
            ["masking", "{common}", "--ks", 3, 5, 31],
            r"--ks \[5, 31\]: model inline_deit_tiny: layer 'blocks.0.attn' attends over a 4x4 token grid "
            r"\(input 28x28\); a k x k window wider than 4 .* expected odd k from 1 to 3",
        ),
        (["locality", "{common}", "--batch-size", 0], "--batch-size must be >= 1, got 0"),
        (["locality", "{common}", "--num-images", -2], r"--num-images must be >= 0 \(0: all\), got -2"),
        (["locality", "{common}", "--images", 0, "--num-images", 2], "--images names the images: give no --num-images"),
        (
            ["locality", "{common}", "--num-images", 7],
            r"--num-images=7 asks for the first 7 evaluation images, but Fashion-MNIST's test split holds 6; "
            r"give at most 6 \(0: all\)",
        ),
    ],
    ids=lambda v: " ".join(map(str, v)) if isinstance(v, list) else None,
)
def test_an_option_the_analysis_ignores_or_a_bad_value_is_refused(tmp_path, fmnist_dir, capsys, argv, message):
    """Issue 36: each option either changes the analysis or is refused before any model is built,
    naming the option and the analyses that read it (or the value and what is expected)."""
    common = ["--model", "inline_deit_tiny", "--model-args", *DEIT, "--data", f"fmnist:{fmnist_dir}"]
    argv = [a for arg in argv for a in (common if arg == "{common}" else [arg])]
    assert run(*argv, "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.startswith("inline-attn: error: ") and len(err.splitlines()) == 1, err
    assert re.search(message, err), err
    assert not list((tmp_path / "out").iterdir())  # refused before anything was written


def test_more_images_than_a_folder_holds_are_refused_and_a_default_count_takes_them_all(tmp_path, folder, capsys):
    """--num-images 7 of a 6-image folder ran 6 and reported them as asked; the analyses' default
    counts (500 for locality) are a most, not a request: the folder's 6 images are taken."""
    common = ["--model", "inline_swin_tiny", "--model-args", *SWIN, "--data", folder]
    assert run("locality", *common, "--num-images", 7, "--out", tmp_path / "seven") == 2
    err = capsys.readouterr().err
    assert f"--num-images=7 asks for the first 7 evaluation images, but --data {folder / 'val'} holds 6" in err, err
    assert run("locality", *common, "--num-images", 6, "--out", tmp_path / "six") == 0
    assert run("locality", *common, "--out", tmp_path / "default") == 0
    assert json.loads((tmp_path / "default" / "locality.json").read_text())["images"] == 6


def test_masking_checks_k_against_the_grids_of_the_masked_layers(tmp_path, folder, capsys):
    """Swin's stages attend over 16x16, 8x8, 4x4 and 2x2 grids of a 64 px input: k = 5 fits the
    first stage's layers but not the last stage's."""
    common = ["--model", "inline_swin_tiny", "--model-args", *SWIN, "--data", folder, "--num-images", 3]
    assert run("masking", *common, "--ks", 5, "--out", tmp_path / "all") == 2
    assert "--ks [5]: model inline_swin_tiny: layer 'layers.3.blocks.0.attn' attends over a 2x2 token grid" in (
        capsys.readouterr().err
    )
    assert run("masking", *common, "--ks", 5, "--layers", "layers.0.*", "--out", tmp_path / "first") == 0
    rows = list(csv.DictReader(open(tmp_path / "first" / "masking.csv")))
    assert [(r["mask"], r["k"]) for r in rows] == [("none", "0"), ("local", "5"), ("random", "5")]


def test_masking_refuses_a_model_of_another_class_count(tmp_path, fmnist_dir, capsys):
    # its top-1 would score a 3-class head against Fashion-MNIST's 10 labels
    three = [a for a in DEIT if not a.startswith("num_classes")] + ["num_classes=3"]
    argv = ["--model", "inline_deit_tiny", "--model-args", *three, "--data", f"fmnist:{fmnist_dir}", "--out", tmp_path]
    assert run("masking", *argv, "--ks", 3) == 2
    assert f"num_classes=3 but --data fmnist:{fmnist_dir} has 10 classes" in capsys.readouterr().err
    assert run("locality", *argv) == 0  # the labels are not scored there: any head will do
