"""Typed config sections: every bad value is refused before any work, naming its key."""

import dataclasses
import pathlib

import pytest
import yaml

from inline_attn.cli import main
from inline_attn.runtime.config import fields_of
from inline_attn.train.config import SECTIONS, Config

from train_helpers import TINY_DEIT, make_fmnist

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("optim.lr", "abc", r"optim.lr='abc': expected a number or null"),
        ("aug.mixup", "abc", r"aug.mixup='abc': expected a number"),
        ("data.batch_size", "0", r"data.batch_size=0: must be >= 1"),
        ("data.batch_size", "-4", r"data.batch_size=-4: must be >= 1"),
        ("data.batch_size", "abc", r"data.batch_size='abc': expected an integer"),
        ("train.eval_every", "0", r"train.eval_every=0: must be >= 1"),
        ("sched.epochs", "1.5", r"sched.epochs=1.5: expected an integer"),
        ("sched.warmup_epochs", "400", r"sched.warmup_epochs=400.0 exceeds sched.epochs=300"),
        ("train.amp", "fp8", r"train.amp='fp8': expected one of 'none', 'bf16', 'fp16', 'auto'"),
        ("train.ema", "yes please", r"train.ema='yes please': expected true or false"),
        ("train.device", "gpu", r"train.device='gpu': expected auto, cpu, cuda or cuda:N"),
        ("aug.scale", "[0.5]", r"aug.scale=\[0.5\]: expected a list of 2 numbers"),
        ("aug.auto_augment", "autoaug", r"aug.auto_augment='autoaug': .*RandAugment"),
        ("data.crop_pct", "1.5", r"data.crop_pct=1.5: must be <= 1"),
        ("data.std", "[0.5, 0]", r"data.std=\[0.5, 0.0\]: every value must be > 0"),
        ("optim.opt", "adam", r"optim.opt='adam': expected one of 'adamw', 'sgd'"),
        ("model.name", "inline_deit_tiniest", r"model.name: unknown model 'inline_deit_tiniest'"),
        ("model.checkpoint", "/no/such.pth", r"model.checkpoint='/no/such.pth': no such file"),
        ("optim.total_batch", "0", r"optim.total_batch=0: must be >= 1"),
        ("optim.no_weight_decay", "5", r"optim.no_weight_decay=5: expected a list of strings or null"),
        ("data.eval_resize", "crop", r"data.eval_resize='crop': expected one of 'shorter', 'squash'"),
        ("train.ema_batch", "-1", r"train.ema_batch=-1: must be >= 1"),
        # issue 36: .inf passed the numeric fields that refuse .nan; min_lr above the lr made it climb
        ("optim.lr", ".inf", r"optim.lr=inf: expected a finite number"),
        ("aug.mixup", ".inf", r"aug.mixup=inf: expected a finite number"),
        ("optim.clip_grad", ".inf", r"optim.clip_grad=inf: expected a finite number"),
        ("data.mean", "[0.5, .inf, 0.5]", r"data.mean=\[0.5, inf, 0.5\]: expected finite numbers"),
        ("sched.min_lr", "0.47", r"sched.min_lr=0.47 exceeds optim.base_lr=0.0005: expected sched.min_lr <= optim"),
        ("sched.warmup_lr", "0.01", r"sched.warmup_lr=0.01 exceeds optim.base_lr=0.0005"),
    ],
)
def test_bad_value_is_refused_naming_the_key(key, value, message, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--output", str(out), f"--{key}", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inline-attn: error: ") and "Traceback" not in err
    import re

    assert re.search(message, err), err
    assert not out.exists()  # refused before any work


def test_lr_floors_may_not_exceed_an_absolute_lr(tmp_path, capsys):
    # sched.min_lr 0.47 over optim.lr 0.004 made the lr climb to 0.47
    out = tmp_path / "run"
    argv = ["train", "--output", str(out), "--optim.lr", "0.004", "--sched.min_lr", "0.47"]
    assert main(argv) == 2
    assert "sched.min_lr=0.47 exceeds optim.lr=0.004: expected sched.min_lr <= optim.lr" in capsys.readouterr().err
    assert not out.exists()
    cfg = Config.load(None, [("optim.lr", 0.004), ("sched.min_lr", 0.004), ("sched.warmup_lr", 0.0)])
    assert cfg.sched.min_lr == cfg.optim.lr  # equal is allowed: a constant lr


def test_yaml_errors_name_the_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: [1, 2\nsched: {}\n")
    assert main(["train", "-c", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"config file {bad}: YAML syntax error at line" in err
    loop = tmp_path / "loop.yaml"
    loop.write_text("_base_: loop.yaml\n")
    assert main(["train", "-c", str(loop)]) == 2
    assert "its _base_ chain loops" in capsys.readouterr().err
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("_base_: b.yaml\n")
    b.write_text("_base_: a.yaml\n")
    with pytest.raises(ValueError, match=r"a.yaml -> .*b.yaml -> .*a.yaml"):
        Config.load(a)


def test_output_naming_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "results.txt"
    f.write_text("keep me")
    assert main(["train", "--output", str(f)]) == 2
    assert "train.output=" in capsys.readouterr().err and f.read_text() == "keep me"


def test_bad_model_kwargs_fail_before_the_data_is_read(tmp_path, capsys, monkeypatch):
    fm = make_fmnist(tmp_path / "fm", n_train=8, n_test=4)
    from inline_attn.train import data as train_data

    monkeypatch.setattr(train_data, "load_fashion_mnist", lambda *a, **k: pytest.fail("data read first"))
    assert (
        main(
            [
                "train",
                "--output",
                str(tmp_path / "r"),
                "--data.dataset",
                "fmnist",
                "--data.path",
                str(fm),
                "--model.kwargs",
                '{depth: "4"}',
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "model.kwargs={'depth': '4'}" in err and "depth='4'" in err


def test_a_no_weight_decay_entry_naming_no_parameter_fails_before_the_data_is_read(tmp_path, capsys, monkeypatch):
    fm = make_fmnist(tmp_path / "fm", n_train=8, n_test=4)
    from inline_attn.train import data as train_data

    monkeypatch.setattr(train_data, "load_fashion_mnist", lambda *a, **k: pytest.fail("data read first"))
    out = tmp_path / "r"
    argv = ["train", "--output", str(out), "--data.dataset", "fmnist", "--data.path", str(fm)]
    assert main(argv + ["--optim.no_weight_decay", "[cls_token, pos_embd]"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inline-attn: error: optim.no_weight_decay=['cls_token', 'pos_embd']: 'pos_embd'"), err
    assert "did you mean pos_embed?" in err and "Traceback" not in err and not (out / "last.pth").exists()


def test_defaults_round_trip_and_every_field_has_a_flag_and_help(tmp_path):
    cfg = Config()
    assert Config.from_dict(cfg.to_dict()) == cfg
    assert Config.from_dict(yaml.safe_load(yaml.safe_dump(cfg.to_dict()))) == cfg
    from inline_attn.cli import build_parser

    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for section, cls in SECTIONS.items():
        for f, _ in fields_of(cls):
            assert f"--{section}.{f.name}" in help_text
            assert f.metadata.get("doc"), f"{section}.{f.name} has no help text"


def test_yaml_floats_and_integral_numbers_are_read_as_typed(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("optim:\n  base_lr: 1e-3\n  lr: 2\nsched:\n  epochs: 4.0\n  warmup_epochs: 1\n")
    cfg = Config.load(p)
    assert cfg.optim.base_lr == 0.001 and cfg.optim.lr == 2.0 and isinstance(cfg.optim.lr, float)
    assert cfg.sched.epochs == 4 and isinstance(cfg.sched.epochs, int)


def test_a_new_setting_is_one_field(tmp_path):
    """Sections are dataclasses: a subclass with one more field is read, checked and written."""

    @dataclasses.dataclass
    class Extra(SECTIONS["optim"]):
        layer_decay: float = dataclasses.field(default=1.0, metadata={"doc": "lr decay per block", "gt": 0})

    from inline_attn.train import config as config_mod

    old = config_mod.SECTIONS["optim"]
    config_mod.SECTIONS["optim"] = Extra
    try:
        cfg = config_mod.Config.from_dict({"optim": {"layer_decay": 0.75}})
        assert cfg.optim.layer_decay == 0.75 and cfg.to_dict()["optim"]["layer_decay"] == 0.75
        with pytest.raises(ValueError, match="optim.layer_decay=0.0: must be > 0"):
            config_mod.Config.from_dict({"optim": {"layer_decay": 0}})
    finally:
        config_mod.SECTIONS["optim"] = old


def test_differences_list_only_what_shapes_the_training():
    saved = Config.load(None, [("data.batch_size", 4), ("data.workers", 0), ("train.max_steps", 3)]).to_dict()
    now = Config.load(None, [("data.batch_size", 2), ("data.workers", 2), ("model.kwargs", dict(TINY_DEIT))])
    diffs = now.differences(saved)
    assert "data.batch_size: 4 -> 2" in diffs and any(d.startswith("model.kwargs:") for d in diffs)
    assert not any(d.startswith(("data.workers", "train.max_steps")) for d in diffs)


def test_configs_are_found_from_any_folder(tmp_path, monkeypatch):
    from inline_attn.train.config import DEMO_CONFIG, configs_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("INLINE_ATTN_CONFIGS", raising=False)
    assert (configs_dir() / DEMO_CONFIG).is_file()  # the source tree's
    mine = tmp_path / "mine"
    (mine / "fmnist").mkdir(parents=True)
    (mine / DEMO_CONFIG).write_text("sched: {epochs: 1, warmup_epochs: 0}\n")
    monkeypatch.setenv("INLINE_ATTN_CONFIGS", str(mine))
    assert configs_dir() == mine


def test_every_fmnist_variant_is_a_shipped_config():
    from inline_attn.train.config import FMNIST_VARIANTS, configs_dir

    shipped = {p.stem for p in (configs_dir() / "fmnist").glob("*.yaml")} - {"_base", "demo"}
    assert sorted(FMNIST_VARIANTS) == sorted(shipped)


def test_installed_wheel_ships_the_configs_and_the_kernel_source(tmp_path):
    """Build the wheel from a copy of the project, unpack it, and find the configs from elsewhere."""
    import shutil
    import subprocess
    import sys
    import zipfile

    repo = pathlib.Path(__file__).resolve().parents[2]
    src = tmp_path / "project"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(repo / name, src / name)
    for name in ("src", "configs"):
        shutil.copytree(repo / name, src / name, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    assert (site / "inline_attn" / "ops" / "fused" / "csrc" / "inline_cpu.cpp").is_file()
    assert (site / "inline_attn" / "ops" / "fused" / "triton_tuning.json").is_file()  # the launch-shape table
    code = "from inline_attn.train import configs_dir; print(configs_dir())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert out.stdout.strip() == str(site / "inline_attn" / "configs")


SEG_RECIPE_DIRS = ("ade20k", "mosaic")  # segmentation configs: checked by tests/dense/test_seg_train.py
RECIPES = sorted(
    str(p.relative_to(CONFIGS))
    for p in CONFIGS.rglob("*.yaml")
    if not p.name.startswith("_") and p.relative_to(CONFIGS).parts[0] not in SEG_RECIPE_DIRS
)


@pytest.mark.parametrize("name", RECIPES)
def test_every_shipped_recipe_is_valid(name):
    """Each config file loads and its model builds (on the meta device) with its data settings."""
    from inline_attn.models import get_model_config
    from inline_attn.train.data import data_info
    from inline_attn.train.task import check_model_args

    cfg = Config.load(CONFIGS / name)
    check_model_args(cfg, data_info(cfg.data, get_model_config(cfg.model.name)))


def test_execution_settings_may_change_on_resume():
    saved = Config.load(None).to_dict()
    now = Config.load(None, [("train.compile", True), ("train.channels_last", True)])
    assert now.differences(saved) == []
