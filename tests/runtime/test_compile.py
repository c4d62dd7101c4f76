"""One vocabulary of torch.compile modes for training and the benchmarks (``inline_attn.runtime.compile``)."""

from __future__ import annotations

import typing

import pytest
import torch

from inline_attn.runtime import compile as compile_lib
from inline_attn.bench import attention as bench_attention_module
from inline_attn.train.config import Config, TrainCfg


def test_unknown_mode_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown compile mode 'fast'.*reduce-overhead"):
        compile_lib.compile_module(torch.nn.Linear(2, 2), "fast")


def test_mode_reaches_torch_compile(monkeypatch):
    seen = []
    monkeypatch.setattr(torch, "compile", lambda module, mode=None: seen.append(mode) or module)
    layer = torch.nn.Linear(2, 2)
    assert compile_lib.compile_module(layer, "reduce-overhead") is layer
    assert seen == ["reduce-overhead"]


def test_training_config_takes_the_same_modes():
    hints = typing.get_type_hints(TrainCfg, include_extras=False)
    assert typing.get_args(hints["compile_mode"]) == compile_lib.COMPILE_MODES
    cfg = Config.load(None, [("train.compile", True), ("train.compile_mode", "reduce-overhead")])
    assert cfg.train.compile_mode == "reduce-overhead"
    with pytest.raises(ValueError, match="compile_mode"):
        Config.load(None, [("train.compile_mode", "fast")])
    # how a run is executed, not what it trains: a resume may change it
    assert cfg.differences(Config.load(None).to_dict()) == []


def test_bench_compiles_each_layer_in_the_asked_mode(monkeypatch):
    modes = []

    def fake_compile(module, mode="default"):
        modes.append(mode)
        return module

    monkeypatch.setattr(bench_attention_module, "compile_module", fake_compile)
    res = bench_attention_module.bench_attention(
        sizes=(2,),
        kinds=("softmax",),
        batch=1,
        modes=("fwd",),
        compile=True,
        compile_mode="reduce-overhead",
        warmup=0,
        repeats=1,
        budget_s=None,
        memory=False,
    )
    assert modes == ["reduce-overhead"] and res["meta"]["compile_mode"] == "reduce-overhead"
    with pytest.raises(ValueError, match="unknown compile mode"):
        bench_attention_module.bench_attention(sizes=(2,), kinds=("softmax",), compile=True, compile_mode="fast")
