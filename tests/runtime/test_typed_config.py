"""The typed config machinery itself (runtime/config.py), on a small config of its own: defaults,
YAML with ``_base_``, dotted overrides, the checks and their messages, saving, and the resume
differences. The task configs built on it are tested in tests/train and tests/dense."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest

from inline_attn.runtime.config import TypedConfig, add_override_options, collect_overrides, setting


@dataclass
class Mosaic:
    size: int = setting(4, ge=1, doc="tiles per side")


@dataclass
class Optim:
    name: Literal["sgd", "adamw"] = setting("sgd", doc="optimizer")
    lr: float = setting(0.1, gt=0, doc="learning rate")
    betas: tuple[float, float] = setting((0.9, 0.999), doc="AdamW betas")
    clip: Optional[float] = setting(None, ge=0, doc="max gradient norm (null: off)")


@dataclass
class Data:
    path: Optional[str] = setting(None, doc="dataset folder", resume=True)
    kwargs: dict = setting(factory=dict, doc="free-form")
    mosaic: Mosaic = field(default_factory=Mosaic)

    def check(self) -> None:
        if self.path == "/":
            raise ValueError("data.path='/': expected a dataset folder")


@dataclass
class Toy(TypedConfig):
    optim: Optim = field(default_factory=Optim)
    data: Data = field(default_factory=Data)


def test_defaults_dict_round_trip_get_and_replace():
    cfg = Toy()
    assert cfg.to_dict() == {
        "optim": {"name": "sgd", "lr": 0.1, "betas": [0.9, 0.999], "clip": None},
        "data": {"path": None, "kwargs": {}, "mosaic": {"size": 4}},
    }
    assert Toy.from_dict(cfg.to_dict()) == cfg and Toy.from_dict(None) == cfg
    assert cfg.get("data.mosaic.size") == 4
    changed = cfg.replace(**{"optim.lr": 0.5, "data.mosaic.size": 2})
    assert (changed.optim.lr, changed.data.mosaic.size, cfg.optim.lr) == (0.5, 2, 0.1)


def test_load_follows_base_then_applies_overrides_and_save_reads_back(tmp_path):
    (tmp_path / "base.yaml").write_text("optim: {name: adamw, lr: 1.0e-3}\ndata: {mosaic: {size: 8}}\n")
    (tmp_path / "run.yaml").write_text("_base_: base.yaml\noptim: {lr: 2.0e-3}\n")
    cfg = Toy.load(tmp_path / "run.yaml", [("data.path", "/data"), ("optim.clip", 5)])
    assert (cfg.optim.name, cfg.optim.lr, cfg.data.mosaic.size) == ("adamw", 2e-3, 8)
    assert (cfg.data.path, cfg.optim.clip) == ("/data", 5.0)
    cfg.save(tmp_path / "out" / "config.yaml")
    assert Toy.load(tmp_path / "out" / "config.yaml") == cfg


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("optim.lr", -1, r"optim\.lr=-1\.0: must be > 0"),
        ("optim.lr", "fast", r"optim\.lr='fast': expected"),
        ("optim.name", "adam", r"optim\.name='adam': expected"),
        ("optim.betas", [0.9], r"optim\.betas=\[0\.9\]: expected"),
        ("data.mosaic.size", 0, r"data\.mosaic\.size=0: must be >= 1"),
        ("data.kwargs", 3, r"data\.kwargs=3: expected"),
        ("optim.lrr", 1, r"unknown config key 'optim\.lrr' \(did you mean lr\?\)"),
        ("data.path", "/", r"data\.path='/': expected a dataset folder"),
    ],
)
def test_a_bad_value_is_refused_naming_key_value_and_expectation(key, value, message):
    with pytest.raises(ValueError, match=message):
        Toy.load(None, [(key, value)])


def test_an_unknown_section_and_bad_files_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"unknown config section 'optimm' \(did you mean optim\?\)"):
        Toy.from_dict({"optimm": {}})
    with pytest.raises(ValueError, match="does not exist"):
        Toy.load(tmp_path / "missing.yaml")
    (tmp_path / "a.yaml").write_text("_base_: b.yaml\n")
    (tmp_path / "b.yaml").write_text("_base_: a.yaml\n")
    with pytest.raises(ValueError, match="_base_ chain loops"):
        Toy.load(tmp_path / "a.yaml")


def test_differences_list_what_changed_outside_the_settings_declared_resume():
    saved = Toy().to_dict()
    now = Toy().replace(**{"optim.lr": 0.2, "data.path": "/elsewhere"})  # data.path: resume=True
    assert now.differences(saved) == ["optim.lr: 0.1 -> 0.2"]
    assert now.differences({"optim": {"lr": -1}})[0].startswith("the checkpoint's config is not valid here")


def test_every_setting_is_a_command_line_flag():
    p = argparse.ArgumentParser()
    add_override_options(p, Toy, "optim.lr=0.1")
    args = p.parse_args(["--optim.lr", "1e-3", "--data.mosaic.size", "2"])
    overrides = dict(collect_overrides(args))
    assert overrides == {"optim.lr": 1e-3, "data.mosaic.size": 2}
    assert Toy.load(None, overrides.items()).optim.lr == 1e-3
