"""Evaluation: unreadable images skipped and counted, eval's own flags in its errors, split folders."""

import json

import pytest

from inline_attn.cli import main
from inline_attn.train.config import Config
from inline_attn.train.task import train
from inline_attn.train.evaluate import evaluate_checkpoint, load_trained_model, run_checkpoint, trained_data_info

from train_helpers import TINY_DEIT, base_overrides, make_folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval")
    root = make_folder(tmp / "imgs", per_class=4)  # 12 val images
    out = tmp / "run"
    train(Config.load(None, base_overrides(out, **{"data.path": str(root), "data.img_size": 16})))
    return root, out / "last.pth"


def test_a_run_folder_rebuilds_as_its_checkpoint_for_eval_and_the_analyses(trained):
    import torch

    from inline_attn.analysis import load_model

    _, last = trained
    run = last.parent
    assert (run / "config.yaml").is_file() and run_checkpoint(run).name == "best.pth"
    net, record = load_trained_model(run)
    assert record["path"] == run / "best.pth" and record["model_kwargs"]["img_size"] == 16
    same, _ = load_trained_model(run / "best.pth")
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(net(x), same(x))
    info = trained_data_info(record)
    lm = load_model(None, run)  # the analyses use the same loader and the same data settings
    assert (
        lm.name == record["model_name"]
        and lm.kwargs == record["model_kwargs"]
        and lm.checkpoint == str(run / "best.pth")
    )
    assert lm.img_size == (16, 16) and (lm.mean, lm.std, lm.crop_pct) == (info.mean, info.std, info.crop_pct)
    assert torch.equal(lm.model(x), net(x))
    with pytest.raises(ValueError, match="but run folder .* trained"):
        load_trained_model(run, model="inline_pvt_tiny")
    with pytest.raises(ValueError, match="does not exist"):
        load_trained_model(run / "missing.pth")


def test_a_save_pretrained_folder_evaluates_without_model_and_refuses_another(trained, tmp_path, capsys):
    """eval of a save_pretrained folder asked for --model, though its config.json names the model;
    given one, it built the registered model without the folder's arguments (img_size 16, 3 classes)."""
    import inline_attn

    root, last = trained
    net, _ = load_trained_model(last)
    folder = inline_attn.save_pretrained(net, tmp_path / "deit")
    flags = [
        "--data",
        str(root),
        "--workers",
        "0",
        "--img-size",
        "16",
        "--crop-pct",
        "0.875",
        "--eval-resize",
        "squash",
    ]
    assert main(["eval", "--checkpoint", str(folder), *flags, "--json", str(tmp_path / "folder.json")]) == 0
    assert main(["eval", "--checkpoint", str(last), *flags, "--json", str(tmp_path / "file.json")]) == 0
    got, want = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("folder", "file"))
    assert got["model"] == "inline_deit_tiny" and got["n"] == want["n"] == 12
    assert (got["top1"], got["top5"], got["loss"]) == (want["top1"], want["top5"], want["loss"])
    capsys.readouterr()
    for checkpoint, named_by in ((folder, f"{folder}/config.json"), (last, f"checkpoint '{last}'")):
        assert main(["eval", "--checkpoint", str(checkpoint), "--model", "inline_pvt_tiny", *flags]) == 2
        err = capsys.readouterr().err
        assert f"--model 'inline_pvt_tiny' but {named_by} names model 'inline_deit_tiny'" in err, err
    assert main(["eval", "--checkpoint", str(folder), "--model", "inline_deit_tiny", *flags]) == 0  # the same name
    backbone = inline_attn.create_model("inline_deit_tiny", img_size=16, features_only=True, **TINY_DEIT)
    features = inline_attn.save_pretrained(backbone, tmp_path / "backbone")
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(features), *flags]) == 2  # no classifier to score
    assert "describes a features_only inline_deit_tiny" in capsys.readouterr().err


def test_unreadable_images_are_skipped_and_counted(trained, tmp_path, capsys):
    root, ckpt = trained
    import shutil

    data = shutil.copytree(root, tmp_path / "imgs")
    for bad in ("cat/0.png", "dog/3.png"):
        (data / "val" / bad).write_bytes(b"not an image")
    res = evaluate_checkpoint(ckpt, str(data), batch_size=5, workers=0)
    assert res["n"] == 10 and res["n_unreadable"] == 2  # no substitute is scored twice
    assert (
        main(
            [
                "eval",
                "--checkpoint",
                str(ckpt),
                "--data",
                str(data),
                "--batch-size",
                "5",
                "--workers",
                "0",
                "--json",
                str(tmp_path / "r.json"),
            ]
        )
        == 0
    )
    assert "10 images scored, 2 unreadable skipped" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["n_unreadable"] == 2


def test_all_images_unreadable_is_an_error(trained, tmp_path, capsys):
    root, ckpt = trained
    for cls in ("cat", "dog", "fox"):  # the checkpoint's 3 classes
        d = tmp_path / "val" / cls
        d.mkdir(parents=True)
        (d / "x.png").write_bytes(b"broken")
    assert main(["eval", "--checkpoint", str(ckpt), "--data", str(tmp_path), "--workers", "0"]) == 2
    assert "no readable image to evaluate (3 unreadable)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--img-size", "0"], "argument --img-size: --img-size '0': must be > 0"),
        (["--batch-size", "-1"], "argument --batch-size: --batch-size '-1': must be > 0"),
        (["--crop-pct", "2"], "argument --crop-pct: --crop-pct '2': must be in (0, 1]"),
        (["--workers", "x"], "argument --workers: --workers 'x': expected an integer >= 0"),
    ],
)
def test_eval_flag_errors_name_the_flag(trained, args, message, capsys):
    root, ckpt = trained
    with pytest.raises(SystemExit) as e:
        main(["eval", "--checkpoint", str(ckpt), "--data", str(root), *args])
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workers", "4"], "--workers: Fashion-MNIST is evaluated from memory at input size 16"),
        (
            ["--img-size", "28", "--crop-pct", "0.9"],
            "--crop-pct: Fashion-MNIST is evaluated from memory at input size 28",
        ),
        (["--img-size", "28", "--eval-resize", "squash"], "--eval-resize: Fashion-MNIST is evaluated from memory"),
    ],
    ids=["workers", "crop-pct", "eval-resize"],
)
def test_eval_refuses_fmnist_options_that_change_nothing(trained, args, message, capsys):
    """Issue 36: Fashion-MNIST is read from memory (no loader processes) and its 28 x 28 images
    are not resized at input size 28, so these options were accepted and ignored."""
    _, ckpt = trained
    assert main(["eval", "--checkpoint", str(ckpt), "--data", "fmnist", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inline-attn: error: ") and message in err, err


def test_eval_runtime_errors_name_eval_flags(trained, tmp_path, capsys):
    root, ckpt = trained
    assert main(["eval", "--checkpoint", str(ckpt), "--data", str(root), "--device", "gpu"]) == 2
    assert "--device='gpu': expected auto, cpu, cuda or cuda:N" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(ckpt), "--data", str(tmp_path / "none")]) == 2
    assert "(--data)" in capsys.readouterr().err


def test_missing_val_split_is_said_clearly(tmp_path, capsys):
    root = make_folder(tmp_path / "imgs", per_class=2)
    import shutil

    shutil.rmtree(root / "val")
    assert (
        main(
            [
                "train",
                "--output",
                str(tmp_path / "run"),
                "--data.path",
                str(root),
                "--data.img_size",
                "16",
                "--model.kwargs",
                "{patch_size: 4, embed_dim: 16, depth: 1, num_heads: 2}",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert f"data folder {root} has no val/ split (it has train/)" in err


def test_a_checkpoint_with_nan_weights_is_not_scored(trained, tmp_path, capsys):
    # its logits are NaN: top-1 would count them as class 0 and report a score
    import torch

    root, ckpt = trained
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    for v in state["model"].values():
        if v.is_floating_point():
            v.fill_(float("nan"))
    bad = tmp_path / "nan.pth"
    torch.save(state, bad)
    assert main(["eval", "--checkpoint", str(bad), "--data", str(root), "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {bad}: " in err and "logits are NaN or inf; a model whose outputs are not finite" in err
