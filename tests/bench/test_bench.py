"""The benchmark harness runs end to end on tiny sizes, writes its files, and reports impossible
cases instead of failing. No timed assertions: speed lives in docs/benchmarks.md."""

from __future__ import annotations

import csv
import json
import math
import re

import pytest
import torch
import torch.nn as nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from inline_attn.bench import (
    ModelCase,
    TensorMemoryTracker,
    attention_layer_flops,
    bench_attention,
    counted_layer_flops,
    bench_models,
    parse_model_spec,
    peak_memory,
    preset_cases,
    time_interleaved,
)
from inline_attn.cli import main
from inline_attn.layers import build_attention


@pytest.mark.parametrize("kind", ["inline", "linear", "softmax"])
def test_analytic_flops_equal_flop_counter(kind):
    b, side, dim, heads = 2, 5, 24, 3
    layer = build_attention(kind, dim, heads)
    x = torch.randn(b, side * side, dim)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), counter:
        layer(x, (side, side))
    counted = counter.get_total_flops()
    assert counted_layer_flops(layer, x, (side, side)) == counted
    analytic = attention_layer_flops(kind, b, side * side, dim, heads)
    print(f"{kind}: counted {counted}, analytic {analytic}")
    assert counted == analytic
    assert attention_layer_flops(kind, b, side * side, dim, heads, backward=True) == 3 * analytic


def test_memory_tracker_counts_live_tensors():
    with TensorMemoryTracker() as tr:
        a = torch.empty(1000, dtype=torch.float32)  # 4000 bytes, kept
        for _ in range(3):
            tmp = torch.empty(5000, dtype=torch.float32)  # 20000 bytes, freed each round
            del tmp
        b = a.view(10, 100)  # a view: no new storage
    assert tr.peak == 24000 and tr.live == 4000
    del a, b
    peak, status = peak_memory(lambda: torch.ones(256, 256) @ torch.ones(256, 256))
    assert status == "ok" and peak >= 3 * 256 * 256 * 4


def test_time_interleaved_records_failures_and_keeps_going():
    def boom():
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 TB")

    res = time_interleaved(
        {"ok": lambda: torch.ones(3).sum(), "oom": boom, "bad": lambda: torch.ones(2) @ torch.ones(3)},
        warmup=1,
        repeats=3,
    )
    assert res["ok"].ok and len(res["ok"].times) == 3 and res["ok"].median > 0
    assert res["oom"].status == "OOM" and math.isnan(res["oom"].median)
    assert res["bad"].status.startswith("error:")


def test_bench_attention_cli_end_to_end(tmp_path, capsys):
    rc = main(
        [
            "bench",
            "attention",
            "--sizes",
            "3",
            "4",
            "--dim",
            "12",
            "--heads",
            "3",
            "--tokens",
            "32",
            "--repeats",
            "2",
            "--out",
            str(tmp_path),
            "--name",
            "att",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "vs softmax" in out and "GFLOP/s" in out and "matmul rate" in out
    rows = list(csv.DictReader(open(tmp_path / "att.csv")))
    assert len(rows) == 2 * 5 * 2  # sizes x kinds (inline, inline-eager, linear, softmax, softmax-math) x modes
    assert {r["kind"] for r in rows} == {"inline", "inline-eager", "linear", "softmax", "softmax-math"}
    data = json.load(open(tmp_path / "att.json"))
    assert data["meta"]["matmul_gflops"] > 0 and data["meta"]["machine"]["torch"] == torch.__version__
    for r in data["rows"]:
        assert r["status"] == "ok" and r["median_ms"] > 0 and r["peak_mib"] > 0 and r["achieved_gflops"] > 0
        assert r["batch"] == max(1, 32 // r["tokens"])
    assert (tmp_path / "att.png").stat().st_size > 1000


def test_bench_attention_times_the_other_linear_attentions():
    # every other linear attention of the paper's comparison is a layer kind; its FLOPs are counted
    others = ["hydra", "efficient", "angular", "relu_msa", "focused"]
    res = bench_attention(sizes=[4], kinds=["softmax", *others], dim=12, heads=3, batch=2, repeats=2, memory=False)
    assert {r["kind"] for r in res["rows"]} == {"softmax", *others}
    for r in res["rows"]:
        assert r["status"] == "ok" and r["median_ms"] > 0 and r["speedup_vs_softmax"] > 0
        layer = build_attention(r["kind"], 12, 3)
        fwd = counted_layer_flops(layer, torch.randn(2, 16, 12), (4, 4))
        assert r["gflop"] * 1e9 == pytest.approx(fwd * (1 if r["mode"] == "fwd" else 3))
        # the qkv and output projections (8 B N C^2) at least; Hydra's core is elementwise, so not counted
        assert fwd >= 8 * 2 * 16 * 12 * 12
    with pytest.raises(ValueError, match="unknown layer kind 'nope'.*hydra"):
        bench_attention(sizes=[4], kinds=["nope"])


def test_bench_attention_reports_an_impossible_case():
    # 10^12 sequences of 9 tokens: no memory for the input; recorded per case, the sweep finishes
    res = bench_attention(sizes=[3, 2], kinds=["inline", "softmax"], dim=12, heads=3, batch=10**12, repeats=1)
    assert len(res["rows"]) == 8
    assert all(r["status"] == "OOM" and math.isnan(r["median_ms"]) for r in res["rows"])
    with pytest.raises(ValueError, match="multiple of heads"):
        bench_attention(sizes=[3], dim=10, heads=3)


def test_parse_model_spec():
    assert parse_model_spec("DeiT-T=inline_deit_tiny:pattern=S,num_heads=3") == (
        "DeiT-T",
        "inline_deit_tiny",
        {"pattern": "S", "num_heads": 3},
    )
    assert parse_model_spec("inline_deit_tiny") == ("inline_deit_tiny", "inline_deit_tiny", {})
    with pytest.raises(ValueError, match="key=value"):
        parse_model_spec("x=inline_deit_tiny:depth")


def test_presets_are_the_papers_sweeps():
    cases, xlabel = preset_cases("window")
    assert xlabel == "window size" and [c.x for c in cases] == [7, 7, 14, 14, 28, 28, 56, 56]
    swin = [c for c in cases if c.label == "Swin-T"]
    assert all(c.overrides == {"pattern": "SSSS", "window_size": 8 * c.x} for c in swin)
    cases, _ = preset_cases("resolution")
    assert [c.resolution for c in cases if c.label == "DeiT-T"] == [224, 384, 640, 1024]
    assert all(c.overrides == {"pattern": "S", "num_heads": 3} for c in cases if c.label == "DeiT-T")


class _Tiny(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 4, stride=4)
        self.head = nn.Linear(width, 5)

    def forward(self, x):
        return self.head(self.conv(x).mean((2, 3)))


def test_bench_models_end_to_end_with_oom_and_bad_size():
    cases = [
        ModelCase("a", lambda: _Tiny(4), 16, 16),
        ModelCase("b", lambda: _Tiny(8), 16, 16),
        ModelCase("a", lambda: _Tiny(4), 10**6, 10**6),
    ]  # a 10^6 x 10^6 image: no memory for it
    res = bench_models(cases, batch=2, repeats=2, macs=False)
    ok = [r for r in res["rows"] if r["x"] == 16]
    assert all(r["status"] == "ok" and r["throughput"] > 0 and r["peak_mib"] > 0 for r in ok)
    assert ok[0]["speedup"] == 1.0
    big = next(r for r in res["rows"] if r["x"] == 10**6)
    assert big["status"] == "OOM" and math.isnan(big["throughput"])
    train = bench_models(cases[:1], batch=2, repeats=1, mode="train", macs=False, memory=False)
    assert train["rows"][0]["status"] == "ok"


def test_bench_model_cli_registered_models(tmp_path, capsys):
    spec = "tiny=inline_deit_tiny:depth=1,embed_dim=24,num_heads=3"
    rc = main(
        [
            "bench",
            "model",
            "--models",
            spec,
            "soft=inline_deit_tiny:depth=1,embed_dim=24,num_heads=3,pattern=S",
            "--resolutions",
            "32",
            "8",
            "--batch",
            "2",
            "--repeats",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    data = json.load(open(tmp_path / "model.json"))
    rows = {(r["label"], r["x"]): r for r in data["rows"]}
    assert rows[("tiny", 32)]["status"] == "ok" and rows[("tiny", 32)]["gmacs"] > 0
    assert rows[("soft", 32)]["speedup"] == 1.0 or rows[("tiny", 32)]["speedup"] == 1.0
    # an 8 x 8 image is smaller than one 16 x 16 patch: reported in the table, not fatal
    assert rows[("tiny", 8)]["status"].startswith("error: ValueError") and math.isnan(rows[("tiny", 8)]["throughput"])
    assert (tmp_path / "model.png").exists() and (tmp_path / "model.csv").exists()
    assert "img/s" in capsys.readouterr().out


def test_bench_model_cli_errors():
    assert main(["bench", "model"]) == 2
    assert main(["bench", "model", "--preset", "window", "--models", "x"]) == 2


def test_bench_residual_compares_both_paths():
    from inline_attn.bench.attention import bench_residual

    res = bench_residual(shapes=((2, 4, 3, 5),), repeats=1)
    assert [r["mode"] for r in res["rows"]] == ["fwd", "fwd+bwd"]
    assert all(r["shift_ms"] > 0 and r["conv_ms"] > 0 and r["speedup"] > 0 for r in res["rows"])


def test_preset_layer_runs_the_attention_sweep(tmp_path, monkeypatch):
    import inline_attn.bench.attention as att

    seen = {}
    real = att.bench_attention

    def small(**kw):
        seen.update(kw)
        return real(**{**kw, "sizes": (3,), "dim": 12, "token_budget": 9, "repeats": 1})

    monkeypatch.setattr(att, "bench_attention", small)
    assert main(["bench", "model", "--preset", "layer", "--out", str(tmp_path), "--no-plot"]) == 0
    assert seen["sizes"] == (14, 28, 56, 112) and seen["dim"] == 96 and seen["heads"] == 3
    assert (tmp_path / "layer.json").exists()


def test_bench_model_breakdown_reports_categories_and_bound(tmp_path, capsys):
    from inline_attn.bench.breakdown import categorize

    assert categorize("inline_attn::inline_forward") == "attention core"
    assert categorize("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention core"
    assert categorize("aten::addmm") == "linear" and categorize("aten::gelu") == "activation"
    assert categorize("aten::native_layer_norm") == "normalization" and categorize("aten::foo") == "other"
    spec = "inl=inline_deit_tiny:depth=1,embed_dim=24,num_heads=3"
    rc = main(
        [
            "bench",
            "model",
            "--models",
            "soft=inline_deit_tiny:depth=1,embed_dim=24,num_heads=3,pattern=S",
            spec,
            "--resolutions",
            "64",
            "--batch",
            "2",
            "--repeats",
            "2",
            "--breakdown",
            "--no-plot",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    assert "bound x" in capsys.readouterr().out
    rows = {r["label"]: r for r in json.load(open(tmp_path / "model.json"))["rows"]}
    for r in rows.values():
        assert r["bd_attention_core"] > 0 and r["bd_linear"] > 0 and 0 < r["core_share"] < 100
        # without its attention core a model is faster than with it: the bound exceeds its speedup
        assert r["bound"] > r["speedup"]


def test_model_spec_impl_eager_runs_without_the_fused_op(monkeypatch):
    from inline_attn.ops import tokens

    calls = []
    for fused in ("inline_core", "inline_layer_core"):  # the core alone, and with the layer's residual predictor
        real = getattr(tokens, fused)
        monkeypatch.setattr(tokens, fused, lambda *a, real=real: calls.append(a[-1]) or real(*a))
    label, name, overrides = parse_model_spec("eager=inline_deit_tiny:depth=1,embed_dim=24,num_heads=3,impl=eager")
    assert overrides["impl"] == "eager"
    case = ModelCase(label, name, 32, 32, overrides)
    res = bench_models([case], batch=2, repeats=1, macs=False, memory=False)
    assert res["rows"][0]["status"] == "ok" and not calls
    on = ModelCase("fused", name, 32, 32, {k: v for k, v in overrides.items() if k != "impl"})
    bench_models([on], batch=2, repeats=1, macs=False, memory=False)
    assert calls and set(calls) == {"cpu"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU fallback")
@pytest.mark.parametrize("bench", ["attention", "model"])
def test_cuda_graphs_flag_on_cpu_says_why_and_times_ungraphed(bench, tmp_path, capsys):
    args = ["--repeats", "2", "--no-memory", "--no-plot", "--out", str(tmp_path), "--name", "g", "--cuda-graphs"]
    if bench == "attention":
        args += ["--sizes", "3", "--dim", "12", "--heads", "3", "--tokens", "18", "--kinds", "inline", "softmax"]
    else:
        args += ["--models", "tiny=inline_deit_tiny:depth=1,embed_dim=24,num_heads=3", "--resolutions", "32"]
        args += ["--batch", "2", "--no-macs", "--mode", "train"]
    assert main(["bench", bench, *args]) == 0
    out = capsys.readouterr().out
    assert "--cuda-graphs: CUDA graphs need a CUDA device, the step runs on cpu; those steps were timed" in out
    data = json.load(open(tmp_path / "g.json"))
    assert data["meta"]["cuda_graphs"] is True
    assert data["meta"]["why_not_graphed"] == "CUDA graphs need a CUDA device, the step runs on cpu"
    assert data["rows"] and all(r["status"] == "ok" for r in data["rows"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["residual", "--repeats", "0"], "--repeats 0: expected an integer >= 1"),
        (["attention", "--warmup", "-1"], "--warmup -1: expected an integer >= 0"),
        (["model", "--threads", "-2"], "--threads -2: expected an integer >= 1"),
    ],
)
def test_bench_refuses_counts_it_cannot_honour(argv, message, tmp_path, capsys):
    # issue 36: --repeats 0 timed nothing and --warmup -1 ran no warm-up, without a word
    from inline_attn.cli import main

    assert main(["bench", *argv, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"repeats": 0}, "repeats=0: expected an integer >= 1"),
        ({"warmup": -1}, "warmup=-1: expected an integer >= 0"),
        ({"budget_s": 0.0}, "budget_s=0.0: expected a finite number of seconds > 0"),
    ],
)
def test_time_interleaved_refuses_empty_rounds(kw, message):
    from inline_attn.bench.timing import time_interleaved

    with pytest.raises(ValueError, match=re.escape(message)):
        time_interleaved({"x": lambda: None}, **kw)


def test_quick_preset_and_its_announcement(capsys):
    from inline_attn.bench.attention import QUICK, bench_attention

    result = bench_attention(
        sizes=(99,),
        kinds=("inline", "softmax"),
        dim=12,
        heads=3,
        token_budget=64,
        modes=("fwd",),
        memory=False,
        quick=True,
    )
    assert sorted({r["side"] for r in result["rows"]}) == list(QUICK["sizes"])
    assert result["meta"]["repeats"] == QUICK["repeats"] and result["meta"]["budget_s"] == QUICK["budget_s"]
    assert "bench attention: 6 cases (3 grids x 2 kinds x 1 modes)" in capsys.readouterr().err
