"""Compiled against eager (``inline_attn.bench.compiled``): the warm-up waits out the recompiles, every
case is timed the same number of rounds on the same images, and the ratio is compiled over eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from inline_attn.bench import compiled
from inline_attn.bench.model import ModelCase


def _tiny():
    return nn.Sequential(nn.Conv2d(3, 4, 4, stride=4), nn.Flatten(), nn.Linear(4 * 2 * 2, 10))


def test_warm_up_lasts_until_a_call_compiles_nothing(monkeypatch):
    graphs = {"n": 0}
    monkeypatch.setattr(compiled, "compiled_graphs", lambda: graphs["n"])

    def compiles_three_times():
        graphs["n"] += graphs["n"] < 3

    assert compiled.warm_until_compiled(compiles_three_times, 2, 8) == 4  # the fourth call compiled nothing
    graphs["n"] = 0
    assert compiled.warm_until_compiled(compiles_three_times, 2, 3) == 3  # at most max_warmup
    assert compiled.warm_until_compiled(lambda: None, 2, 8) == 2  # at least warmup


def test_each_model_eager_and_compiled_interleaved(monkeypatch):
    built = []
    monkeypatch.setattr(
        compiled, "compile_module", lambda m, mode: built.append(mode) or torch.compile(m, backend="eager")
    )
    inputs, step = [], compiled.training_step
    monkeypatch.setattr(compiled, "training_step", lambda m, x, t, amp: inputs.append((x, t)) or step(m, x, t, amp))
    cases = [ModelCase("A", _tiny, 8), ModelCase("B", _tiny, 8)]
    res = compiled.compile_ab(cases, batch=2, repeats=3, warmup=1, max_warmup=4)
    assert built == ["default", "default"]
    assert len(inputs) == 4 and all(x is inputs[0][0] and t is inputs[0][1] for x, t in inputs)  # the same batch
    assert [r["model"] for r in res["rows"]] == ["A", "B"]
    for r in res["rows"]:
        assert r["repeats"] == 3 and r["recompiles"] == 0
        assert r["ratio"] == pytest.approx(r["eager_ms"] / r["compiled_ms"])
        assert r["compiled_img_s"] == pytest.approx(2e3 / r["compiled_ms"])
    assert res["meta"]["clock"] == "thread CPU time" and res["meta"]["warmup_calls"] >= 1
    assert compiled.table(res)[0] == "| model | eager ms | compiled ms | compiled / eager | recompiles while timed |"


def test_the_graphed_case_is_a_third_model_timed_beside_the_others(monkeypatch):
    # on the CPU nothing can be captured: the eager copy is timed ungraphed and the reason is kept
    monkeypatch.setattr(compiled, "compile_module", lambda m, mode: torch.compile(m, backend="eager"))
    res = compiled.compile_ab([ModelCase("A", _tiny, 8)], batch=2, repeats=3, warmup=1, max_warmup=4, graphed=True)
    (row,) = res["rows"]
    assert row["ratio_graphed"] == pytest.approx(row["graphed_ms"] / row["compiled_ms"])
    assert row["graphed_img_s"] == pytest.approx(2e3 / row["graphed_ms"])
    assert "CUDA" in res["meta"]["why_not_graphed"]
    plain = compiled.compile_ab([ModelCase("A", _tiny, 8)], batch=2, repeats=3, warmup=1, max_warmup=4)
    assert "graphed_ms" not in plain["rows"][0] and "why_not_graphed" not in plain["meta"]


def test_counts_out_of_range_are_refused():
    with pytest.raises(ValueError, match="warmup=5, max_warmup=2"):
        compiled.compile_ab([ModelCase("A", _tiny, 8)], warmup=5, max_warmup=2)


def test_thread_times_are_taken_round_robin_after_the_warm_up():
    from inline_attn.bench.timing import thread_times_interleaved

    calls = []
    cases = {k: (lambda k=k: calls.append(k)) for k in "ab"}
    times = thread_times_interleaved(cases, repeats=3, warmup=2)
    assert calls == ["a", "a", "b", "b"] + ["a", "b"] * 3
    assert {k: len(t) for k, t in times.items()} == {"a": 3, "b": 3} and all(x >= 0 for t in times.values() for x in t)
    with pytest.raises(ValueError, match="repeats=0"):
        thread_times_interleaved(cases, repeats=0)
