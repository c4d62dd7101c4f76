"""Config files and overrides, the train/eval/reproduce commands, and clear errors for bad input."""

import json

import pytest
import torch
import yaml

from inline_attn.cli import main
from inline_attn.data import TensorImageDataset
from inline_attn.runtime.config import parse_value
from inline_attn.train.config import Config
from inline_attn.train.data import Batches
from inline_attn.train.evaluate import accuracy_counts, evaluate

from train_helpers import TINY_DEIT, make_fmnist, make_folder

QUICK = {
    "data": {"batch_size": 4, "workers": 0},
    "aug": {"crop": "pad", "auto_augment": None, "re_prob": 0.0, "mixup": 0.0, "cutmix": 0.0},
    "optim": {"lr": 1.0e-3},
    "sched": {"epochs": 1, "warmup_epochs": 0, "cooldown_epochs": 0},
    "train": {"progress": False, "tensorboard": False},
}


def _write_cfg(path, **sections):
    cfg = {k: dict(v) for k, v in QUICK.items()}
    for k, v in sections.items():
        cfg.setdefault(k, {}).update(v)
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_yaml_then_overrides_and_yaml11_floats(tmp_path):
    p = tmp_path / "base.yaml"
    p.write_text("optim:\n  lr: 1e-3\n  weight_decay: 0.01\nsched:\n  epochs: 7\n")
    child = tmp_path / "child.yaml"
    child.write_text("_base_: base.yaml\nsched:\n  epochs: 9\n")
    cfg = Config.load(child, [("optim.weight_decay", 0.2), ("model.kwargs.depth", 2)])
    assert cfg.sched.epochs == 9 and cfg.optim.weight_decay == 0.2 and cfg.optim.lr == 0.001
    assert cfg.model.kwargs == {"depth": 2} and cfg.optim.clip_grad == 5.0  # default kept
    assert parse_value("1e-3") == 0.001 and parse_value("[1, 2]") == [1, 2] and parse_value("null") is None


def test_a_mapping_override_merges_into_the_configs_mapping(tmp_path, monkeypatch):
    """--model.kwargs '{num_heads: 3}' changes one constructor argument: the config's others stay
    (replacing the mapping trained the default DeiT-T instead of the config's model)."""
    import inline_attn.train.task as task

    trained = []
    monkeypatch.setattr(task, "train", lambda cfg: trained.append(cfg) or {"rank": 0})
    cfg = _write_cfg(
        tmp_path / "c.yaml",
        model={"name": "inline_deit_tiny", "kwargs": {"embed_dim": 64, "patch_size": 4, "num_heads": 2}},
    )
    assert main(["train", "-c", str(cfg), "--model.kwargs", "{num_heads: 3}"]) == 0
    assert trained[0].model.kwargs == {"embed_dim": 64, "patch_size": 4, "num_heads": 3}
    assert Config.load(cfg, [("model.kwargs", {"mlp_ratio": 2.0})]).model.kwargs["embed_dim"] == 64
    from inline_attn.cli import build_parser

    help_text = " ".join(build_parser()._subparsers._group_actions[0].choices["train"].format_help().split())
    assert "merges into the config's mapping key by key" in help_text


def test_unknown_keys_are_clear_errors(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("optim:\n  lrr: 0.1\n")
    with pytest.raises(ValueError, match=r"unknown config key 'optim.lrr' \(did you mean lr"):
        Config.load(p)
    with pytest.raises(ValueError, match="unknown config section 'trian'"):
        Config.load(None, [("trian.seed", 1)])
    with pytest.raises(ValueError, match="does not exist"):
        Config.load(tmp_path / "missing.yaml")


def test_cli_train_overrides_saved_config_then_eval(tmp_path, capsys):
    fm = make_fmnist(tmp_path / "fm", n_train=8, n_test=6)
    cfg = _write_cfg(
        tmp_path / "c.yaml",
        model={"name": "inline_deit_tiny", "kwargs": {"depth": 3}},
        data={"dataset": "fmnist", "path": str(fm)},
    )
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            "-c",
            str(cfg),
            "--output",
            str(out),
            "--optim.weight_decay",
            "1e-2",
            "--model.kwargs",
            json.dumps({k: v for k, v in TINY_DEIT.items() if k != "depth"}),
            "--set",
            "model.kwargs.depth=1",
            "--train.seed",
            "3",
        ]
    )
    assert rc == 0 and "top-1" in capsys.readouterr().out
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["optim"]["weight_decay"] == 0.01 and saved["train"]["seed"] == 3
    assert saved["model"]["kwargs"] == {**TINY_DEIT, "depth": 1} and saved["data"]["path"] == str(fm)
    rc = main(
        ["eval", "--checkpoint", str(out / "last.pth"), "--data", f"fmnist:{fm}", "--json", str(tmp_path / "e.json")]
    )
    assert rc == 0 and "top-1" in capsys.readouterr().out
    res = json.loads((tmp_path / "e.json").read_text())
    assert res["n"] == 6 and res["model"] == "inline_deit_tiny"


def test_cli_bad_inputs(tmp_path, capsys):
    cfg = _write_cfg(
        tmp_path / "c.yaml",
        model={"name": "inline_deit_tiny", "kwargs": dict(TINY_DEIT)},
        data={"path": str(tmp_path / "no_such_folder"), "img_size": 16},
    )
    assert main(["train", "-c", str(cfg), "--output", str(tmp_path / "r")]) == 2
    assert "no_such_folder does not exist" in capsys.readouterr().err
    assert main(["train", "-c", str(cfg), "--model.name", "inline_deit_tiniest"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'inline_deit_tiniest'" in err and "inline_deit_tiny" in err
    assert main(["train", "-c", str(cfg), "--set", "optim.momentumm=0.9"]) == 2
    assert "unknown config key 'optim.momentumm'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["train", "-c", str(cfg), "--optim.lrr", "0.1"])
    assert e.value.code == 2 and "unrecognized arguments: --optim.lrr" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(tmp_path / "nope.pth"), "--data", "fmnist"]) == 2
    assert "nope.pth' does not exist" in capsys.readouterr().err
    assert main(["train", "-c", str(cfg), "--data.dataset", "fmnist", "--data.path", str(tmp_path / "nofm")]) == 2
    assert "apt-get install -y dataset-fashion-mnist" in capsys.readouterr().err


class _Lookup(torch.nn.Module):
    """Logits read from a table by the image's first pixel (the sample index)."""

    def __init__(self, table):
        super().__init__()
        self.table = table
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return self.table[x[:, 0, 0, 0].round().long()]


def test_eval_top1_top5_known_case():
    logits = torch.tensor([[9.0, 8, 7, 6, 5, 4], [0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0], [1, 2, 3, 4, 5, 9]])
    labels = torch.tensor([0, 0, 4, 5])  # top-1: rows 0 and 3; top-5: row 2 too (rank 5), not row 1 (rank 6)
    assert accuracy_counts(logits, labels) == [2, 3]
    ds = TensorImageDataset(torch.arange(4, dtype=torch.uint8).view(4, 1, 1, 1).expand(4, 1, 2, 2).contiguous(), labels)
    res = evaluate(_Lookup(logits), Batches(ds, 3, train=False), lambda x: x.float(), torch.device("cpu"))
    assert res == pytest.approx(
        {
            "top1": 50.0,
            "top5": 75.0,
            "n": 4,
            "n_unreadable": 0,
            "loss": torch.nn.functional.cross_entropy(logits, labels).item(),
        }
    )


def test_reproduce_command_writes_table(tmp_path, capsys):
    fm = make_fmnist(tmp_path / "fm", n_train=8, n_test=6)
    cdir = tmp_path / "configs"
    (cdir / "fmnist").mkdir(parents=True)
    for v, pat in (("softmax", "S"), ("inline", "I")):
        _write_cfg(
            cdir / "fmnist" / f"{v}.yaml",
            model={"name": "inline_deit_tiny", "kwargs": {**TINY_DEIT, "pattern": pat}},
            data={"dataset": "fmnist", "path": str(fm)},
        )
    rc = main(
        [
            "reproduce",
            "fmnist",
            "--configs",
            str(cdir),
            "--output",
            str(tmp_path / "runs"),
            "--variants",
            "softmax",
            "inline",
            "--epochs",
            "1",
        ]
    )
    assert rc == 0
    text = (tmp_path / "runs" / "report.md").read_text()  # the table, in the output folder
    assert text.startswith("## Fashion-MNIST: the four attention variants")
    assert "| Softmax attention (pattern S) |" in text and "| InLine (with local residual) |" in text
    assert text in capsys.readouterr().out
    assert (tmp_path / "runs" / "inline" / "last.pth").is_file()


def test_demo_command_trains_and_reports_paths(tmp_path, capsys):
    fm = make_fmnist(tmp_path / "fm", n_train=8, n_test=6)
    cfg = _write_cfg(
        tmp_path / "demo.yaml",
        model={"name": "inline_deit_tiny", "kwargs": dict(TINY_DEIT)},
        data={"dataset": "fmnist", "path": str(fm)},
    )
    out = tmp_path / "demo"
    assert main(["demo", "--config", str(cfg), "--output", str(out), "--epochs", "1"]) == 0
    text = capsys.readouterr().out
    assert "test top-1" in text and str(out / "curves.png") in text and str(out / "summary.json") in text
    assert (out / "curves.png").is_file() and (out / "last.pth").is_file()


def test_eval_foreign_checkpoint_needs_model_and_must_fit(tmp_path, capsys):
    from inline_attn.models import create_model

    fm = make_fmnist(tmp_path / "fm", n_train=8, n_test=6)
    net = create_model("inline_deit_tiny", img_size=28, in_chans=1, num_classes=10, **TINY_DEIT)
    torch.save({"model": net.state_dict()}, tmp_path / "w.pth")
    assert main(["eval", "--checkpoint", str(tmp_path / "w.pth"), "--data", f"fmnist:{fm}"]) == 2
    assert "pass --model NAME" in capsys.readouterr().err
    assert (
        main(["eval", "--model", "inline_deit_tiny", "--checkpoint", str(tmp_path / "w.pth"), "--data", f"fmnist:{fm}"])
        == 2
    )  # the published model's shapes: a clear mismatch
    assert "missing keys" in capsys.readouterr().err


def _recorded_checkpoint(path, **kwargs):
    """A checkpoint as the trainer records it: the weights with the model's name and arguments."""
    from inline_attn.models import create_model

    kwargs = {**TINY_DEIT, **kwargs}
    net = create_model("inline_deit_tiny", **kwargs)
    torch.save({"model": net.state_dict(), "model_name": "inline_deit_tiny", "model_kwargs": kwargs}, path)
    return path


def test_eval_refuses_data_of_another_class_count(tmp_path, capsys):
    # a 3-class head on 5 classes' labels (an IndexError in the loss), on 10 (a silent wrong top-1)
    ckpt = _recorded_checkpoint(tmp_path / "three.pth", img_size=16, num_classes=3)
    five = make_folder(tmp_path / "five", classes=tuple("abcde"), per_class=1)
    assert main(["eval", "--checkpoint", str(ckpt), "--data", str(five), "--workers", "0"]) == 2
    assert f"checkpoint {ckpt}: num_classes=3 but --data {five} has 5 classes" in capsys.readouterr().err
    fm = make_fmnist(tmp_path / "fm", n_train=8, n_test=6)
    ckpt = _recorded_checkpoint(tmp_path / "three28.pth", img_size=28, in_chans=1, num_classes=3)
    assert main(["eval", "--checkpoint", str(ckpt), "--data", f"fmnist:{fm}"]) == 2
    assert f"num_classes=3 but --data fmnist:{fm} has 10 classes" in capsys.readouterr().err


@pytest.mark.parametrize("num_classes", [5, 0])
def test_train_refuses_a_head_of_another_class_count(tmp_path, capsys, num_classes):
    fm = make_fmnist(tmp_path / "fm", n_train=8, n_test=6)
    cfg = _write_cfg(
        tmp_path / "c.yaml", model={"name": "inline_deit_tiny", "kwargs": dict(TINY_DEIT)}, data={"path": str(fm)}
    )
    out = tmp_path / "run"
    argv = ["train", "-c", str(cfg), "--data.dataset", "fmnist", "--output", str(out)]
    assert main([*argv, "--set", f"model.kwargs.num_classes={num_classes}"]) == 2
    assert f"model.kwargs.num_classes={num_classes} but the data has 10 classes" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == [".lock"]  # refused before anything is written


def test_train_refuses_a_folder_of_one_class(tmp_path, capsys):
    one = make_folder(tmp_path / "one", classes=("cat",), per_class=2)
    cfg = _write_cfg(
        tmp_path / "c.yaml",
        model={"name": "inline_deit_tiny", "kwargs": dict(TINY_DEIT)},
        data={"path": str(one), "img_size": 16},
    )
    assert main(["train", "-c", str(cfg), "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"data folder {one / 'val'} holds one class ('cat')" in err and "at least 2" in err


def test_a_refused_write_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    import errno
    import os

    import inline_attn._io as io

    def full_disk(path, text):  # as the writer reports a full disk
        raise io.WriteFailed(path, errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(io, "atomic_write_text", full_disk)
    fm = make_fmnist(tmp_path / "fm", n_train=8, n_test=6)
    ckpt = _recorded_checkpoint(tmp_path / "w.pth", img_size=28, in_chans=1, num_classes=10)
    out = tmp_path / "e.json"
    assert main(["eval", "--checkpoint", str(ckpt), "--data", f"fmnist:{fm}", "--json", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"inline-attn: error: cannot write {out}: No space left on device; the previous file, if any, is unchanged\n"
    )
