"""The run and optimizer settings every task shares are declared once (``runtime.config.RunCfg``,
``OptimCfg``): a task's section may give one its own default (``defaults=``), never its own type,
help or range."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

import pytest

from inline_attn.dense.config import DetConfig, SegConfig
from inline_attn.runtime.config import OptimCfg, RunCfg, setting
from inline_attn.train.config import Config

SHARED = {"train": RunCfg, "optim": OptimCfg}


@pytest.mark.parametrize("config", [Config, SegConfig, DetConfig], ids=lambda c: c.__name__)
def test_no_shared_setting_is_declared_twice(config):
    for section, base in SHARED.items():
        own = type(getattr(config(), section))
        assert issubclass(own, base)
        base_fields, own_fields = base.__dataclass_fields__, own.__dataclass_fields__
        base_types, own_types = typing.get_type_hints(base), typing.get_type_hints(own)
        for name in base_fields:
            assert dict(own_fields[name].metadata) == dict(base_fields[name].metadata), (section, name)
            assert own_types[name] == base_types[name], (section, name)


def test_each_task_keeps_its_defaults():
    cls, seg, det = Config(), SegConfig(), DetConfig()
    assert (cls.train.output, seg.train.output, det.train.output) == ("runs/train", "runs/seg", "runs/det")
    assert (cls.optim.lr, cls.optim.weight_decay, cls.optim.clip_grad) == (None, 0.05, 5.0)
    assert (seg.optim.lr, seg.optim.weight_decay, seg.optim.clip_grad) == (2.0e-4, 1.0e-4, None)
    with pytest.raises(ValueError, match="optim.lr=null: segmentation and detection"):
        SegConfig.load(overrides=[("optim.lr", None)])


def test_a_default_outside_the_declaration_fails_when_the_class_is_made():
    with pytest.raises(ValueError, match="Bad.eps"):

        @dataclass
        class Bad(OptimCfg, defaults={"eps": -1.0}):  # eps > 0
            pass

    with pytest.raises(TypeError, match="names no shared setting"):

        @dataclass
        class Unknown(OptimCfg, defaults={"momentum": 0.9}):
            pass

    with pytest.raises(TypeError, match="names no shared setting"):

        @dataclass
        class Twice(OptimCfg, defaults={"eps": 1e-6}):
            eps: float = setting(1e-6, gt=0, doc="declared again")

    assert [f.name for f in dataclasses.fields(SegConfig().optim)][:3] == ["opt", "betas", "eps"]
