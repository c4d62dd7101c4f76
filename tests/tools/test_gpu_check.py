"""``make gpu-check`` without a GPU: the step order and budgets, the results within a lease's
limits, the goal table, and each step's bookkeeping, with the GPU parts stubbed."""

from __future__ import annotations

import functools
import inspect
import json
import math
import pathlib
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from tools.gpu_check import (
    autotune_step,
    compile_step,
    budget,
    core,
    goals,
    goals_step,
    kernels,
    output,
    profile_step,
    runner,
    tests_step,
    train_step,
)
from tools.gpu_check.budget import Part, StepContext

from inline_attn.ops.fused import triton as triton_core
from inline_attn.ops.fused.core_choice import CoreChoice

# seconds a child process gets to start before it is interrupted (margin for a loaded machine)
START_MARGIN_S = 3.0


def test_exits_at_once_without_cuda(capsys, tmp_path):
    if torch.cuda.is_available():
        return  # this machine has a GPU: the check would run for minutes
    assert runner.main(["--out", str(tmp_path / "x")]) == 2
    assert "no CUDA device here" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_make_target_without_cuda():
    if torch.cuda.is_available():
        return
    proc = subprocess.run(
        ["make", "-s", "gpu-check", "GPU_PYTHON=python3"], capture_output=True, text=True, cwd=tests_step.ROOT
    )
    assert proc.returncode != 0 and "no CUDA device here" in proc.stdout + proc.stderr


def test_the_default_steps_run_by_value_within_the_lease_script():
    defaults = [name for name, s in runner.STEPS.items() if s.default]
    assert defaults == ["tests", "goals", "profile", "compile", "ncu"]
    assert list(runner.STEPS)[: len(defaults)] == defaults  # the on-demand steps come after them
    assert sum(runner.STEPS[name].budget_s for name in defaults) <= runner.TOTAL_S
    assert runner.TOTAL_S + runner.COPY_RATE_S <= runner.LEASE_SCRIPT_S == 8 * 60
    for name, step in runner.STEPS.items():
        assert 0 < step.min_s <= step.budget_s <= 10 * 60, name  # a lease's command runs 10 minutes at most
        parts = getattr(sys.modules[step.run.__module__], "PARTS", ())
        assert step.parts == tuple(p.name for p in parts), name
        # every part fits its step's box
        assert all(p.usual_s <= step.budget_s for p in parts), name


def test_a_step_starts_only_while_its_least_time_fits_and_gets_at_most_its_budget():
    step = runner.STEPS["goals"]
    assert runner.plan(step, 1000.0) == (True, step.budget_s)
    assert runner.plan(step, step.min_s) == (True, step.min_s)
    assert runner.plan(step, step.min_s - 1)[0] is False


def _fake_main(monkeypatch, steps: dict, tmp_path, argv: list[str]) -> tuple[int, dict]:
    monkeypatch.setattr(runner, "STEPS", steps)
    monkeypatch.setattr(runner.torch.cuda, "is_available", lambda: True)
    # main() drops TRITON_INTERPRET for its CUDA kernels; this process's Triton tests need it back
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(
        runner.device, "versions", lambda: {"device": "stand-in GPU", "driver": "-", "torch": "-", "triton": "-"}
    )
    monkeypatch.setattr(runner.device, "copy_bandwidth", lambda: 3e12)
    out = tmp_path / "gc"
    code = runner.main(["--out", str(out), *argv])
    return code, json.loads((out / "gpu_check.json").read_text())["results"]


def test_main_runs_the_steps_in_order_saves_as_it_goes_and_skips_what_no_longer_fits(tmp_path, monkeypatch):
    calls, seen_mid_step = [], []

    def fake(name, seconds=0.0, fail=False):
        def run(ctx):
            calls.append((name, ctx.deadline - time.time()))
            ctx.save({"ok": True, "summary": f"{name} half done"})
            seen_mid_step.append(json.loads((ctx.out / "gpu_check.json").read_text())["results"][name])
            time.sleep(seconds)
            if fail:
                raise RuntimeError("no kernel image")
            return {"ok": True, "summary": f"{name} ran"}

        return run

    steps = {
        "tests": runner.Step(fake("tests", seconds=1.0), budget_s=60, min_s=0.5),
        "goals": runner.Step(fake("goals", fail=True), budget_s=60, min_s=0.5),
        "profile": runner.Step(fake("profile"), budget_s=60, min_s=30),
        "train": runner.Step(fake("train"), budget_s=60, min_s=0.1, default=False),
    }
    code, saved = _fake_main(
        monkeypatch, steps, tmp_path, ["--budget-s", "10", "--steps", "train", "profile", "goals", "tests", "goals"]
    )
    assert [name for name, _ in calls] == ["tests", "goals", "train"]  # the check's order, once each
    assert calls[0][1] <= 10.0 and calls[1][1] < 9.1  # each box: what was left, at most the budget
    # saved while the step ran: its partial result, marked so
    assert {k: seen_mid_step[0][k] for k in ("ok", "summary", "partial")} == {
        "ok": True,
        "summary": "tests half done",
        "partial": True,
    }
    assert saved["profile"]["ok"] is None
    assert saved["profile"]["summary"].startswith("not started: ") and saved["profile"]["summary"].endswith(
        "it needs 30 s"
    )
    assert saved["goals"]["ok"] is False and "RuntimeError: no kernel image" in saved["goals"]["summary"]
    assert "RuntimeError: no kernel image" in (tmp_path / "gc" / "errors.txt").read_text()
    assert (
        saved["tests"]["summary"] == "tests ran"
        and saved["tests"]["seconds"] >= 1.0
        and "partial" not in saved["tests"]
    )
    assert code == 1  # a failed step fails the check
    summary = (tmp_path / "gc" / "summary.md").read_text()
    assert "| goals | FAIL |" in summary and "| profile | skipped |" in summary and "stand-in GPU" in summary


def _fake_training(run_dir_arg: int) -> str:
    """A child that leaves what ``inline-attn train`` leaves: metrics, summary and a checkpoint."""
    return (
        "import json, pathlib, sys\n"
        f"run = pathlib.Path(sys.argv[{run_dir_arg}]); run.mkdir(parents=True)\n"
        "graphed = sys.argv[-1] == 'true'\n"
        "(run / 'metrics.csv').write_text('epoch,train_loss\\n0,1.2\\n1,0.8\\n2,0.6\\n3,0.55\\n')\n"
        "cg = {'graphed': graphed, 'train_replays': 100 if graphed else 0, 'eval_replays': 60 if graphed else 0}\n"
        "final = {'val_top1': 80.0, 'val_top1_ema': 79.0}\n"
        "(run / 'summary.json').write_text(json.dumps({'final': final, 'steps': 100, 'cuda_graphs': cg}))\n"
        "(run / 'checkpoint_last.pt').write_bytes(bytes(1 << 20))\n"
    )


def test_the_results_come_back_through_a_lease_without_checkpoints(tmp_path, monkeypatch):
    # the real tests and train steps, their commands stubbed: a 20 MB test log and training runs
    # that write checkpoints; the results folder keeps to 8 files of 16 MB, none a checkpoint
    log_child = "import sys\nfor i in range(200000): sys.stdout.write('x' * 99 + '\\n')\nprint('3 passed in 1.0s')"
    monkeypatch.setattr(tests_step, "tests_command", lambda files, quick, xdist: [sys.executable, "-c", log_child])

    def train_command(data, run_dir, graphed):
        return [sys.executable, "-c", _fake_training(1), str(run_dir), "true" if graphed else "false"]

    monkeypatch.setattr(train_step, "train_command", train_command)
    monkeypatch.setattr(train_step, "fmnist_dir", lambda: tmp_path)

    def profile(ctx):
        (ctx.out / "profile.txt").write_text("tables\n")
        return {"ok": True, "summary": "profiled"}

    steps = {
        "tests": runner.Step(tests_step.run, budget_s=60, min_s=1),
        "profile": runner.Step(profile, budget_s=60, min_s=1),
        "train": runner.Step(train_step.run, budget_s=60, min_s=1),
    }
    code, saved = _fake_main(monkeypatch, steps, tmp_path, ["--steps", "tests", "profile", "train"])
    out = tmp_path / "gc"
    assert output.limit_problems(out) == [] and code == 0, saved
    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert set(files) <= set(output.FILES) and len(output.FILES) < output.MAX_FILES
    assert (out / "tests.log").stat().st_size <= output.LOG_BYTES + 100
    assert (out / "tests.log").read_text().endswith("3 passed in 1.0s\n")
    assert saved["tests"]["summary"].startswith("3 passed in 1.0s") and saved["train"]["ok"] is True
    assert not list(tmp_path.glob("**/*.pt"))  # the scratch runs are gone with their checkpoints


def test_limit_problems_names_what_a_lease_would_not_return(tmp_path):
    for i in range(8):
        (tmp_path / f"f{i}.txt").write_text("x")
    with open(tmp_path / "big.json", "wb") as fh:
        fh.truncate(output.MAX_FILE_BYTES + 1)
    (tmp_path / "model.pt").write_bytes(b"0")
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "deep.txt").write_text("x")
    (tmp_path / "a" / "odd name.txt").write_text("x")
    problems = output.limit_problems(tmp_path)
    assert problems[0] == "12 files, more than the 8 a lease returns"
    assert "big.json: 16.0 MB, over the 16 MB a file may have" in problems
    assert "model.pt: a checkpoint; the results never hold one" in problems
    assert "a/b/c/deep.txt: 3 folders deep, more than 2" in problems
    assert "a/odd name.txt: a name with characters other than letters, digits, '.', '_' and '-'" in problems
    assert len(problems) == 5


def test_a_long_log_keeps_its_head_and_tail(tmp_path):
    log = tmp_path / "tests.log"
    log.write_text("head\n" + "x" * 1000 + "\ntail\n")
    output.cap_log(log, max_bytes=100)
    text = log.read_text()
    assert text.startswith("head\n") and text.endswith("\ntail\n") and "[... 911 bytes left out ...]" in text


def test_the_goal_table_gives_each_goal_its_value_verdict_device_and_command():
    results = {
        "goals": {
            "ok": True,
            "values": {"deit_eager": 0.83, "deit_graphed": 1.12, "host_ratio": 1.1, "core56": 15.2},
            "notes": {"deit_eager": "SDPA backend cudnn"},
            "parts": {"deit": {}, "host": {}, "core": {}, "swin": {"error": "OutOfMemoryError: CUDA"}},
            "skipped": {"layer": "not started: 3 s left in the box, it takes about 20 s"},
        },
        "profile": {"ok": None, "summary": "not started: 10 s of the 420 s budget left, it needs 15 s"},
    }
    table = goals.goal_table(results, "NVIDIA H100 80GB HBM3")
    lines = table.splitlines()
    assert lines[0] == "| goal | measured | target | verdict | device | notes | command |"
    assert len(lines) == 2 + len(goals.GOALS)
    cmd = '`make gpu-check GPU_CHECK_ARGS="--steps goals --parts deit"`'
    row = "| InLine-DeiT-T / DeiT-T, eager, 224 px, B 128 | 0.83x | (>= 1.03x) | reported | NVIDIA H100 80GB HBM3 |"
    assert f"{row} SDPA backend cudnn | {cmd} |" in lines  # an eager row beside its graphed goal
    assert any(
        line.startswith("| InLine-DeiT-T / DeiT-T, CUDA-graphed, 224 px, B 128 | 1.12x | >= 1.03x | met |")
        for line in lines
    )
    assert any("| 1.10x | <= 1.05x | missed |" in line for line in lines)  # host time: at most
    assert any("| 15 % | >= 70 % | missed |" in line for line in lines)
    assert any("| not measured: part swin failed (OutOfMemoryError: CUDA) | (>= 1.03x) | - |" in line for line in lines)
    assert any("not measured: part layer not started: 3 s left in the box" in line for line in lines)
    # the core part ran: a size it gave no value for says only that
    assert any(
        line.startswith("| Triton core fwd+bwd / copy rate, 7x7 B 1024 | not measured | >= 50 % | - |")
        for line in lines
    )
    profile_row = next(line for line in lines if "GPU-busy share" in line)
    assert "not measured: the profile step not started: 10 s of the 420 s budget left" in profile_row
    compile_row = next(line for line in lines if "torch.compile" in line)
    assert "not measured: the compile step did not run" in compile_row


def test_every_goal_names_a_part_of_its_step():
    for goal in goals.GOALS:
        assert goal.part in runner.STEPS[goal.step].parts, goal
    assert tuple(shape.key for shape in core.CORE_SHAPES) == tuple(goals.CORE_GOALS)


def test_parts_run_in_order_within_the_box_and_a_failing_part_does_not_stop_the_rest(tmp_path):
    saved, errors = [], []

    def part(value=None, fail=False):
        def run(ctx):
            if fail:
                raise ValueError("bad shape")
            return {"values": {"v": value}, "notes": {"v": "note"}, "rows": [1]}

        return run

    ctx = StepContext(
        tmp_path,
        False,
        time.time() + 50,
        save=lambda r: saved.append(json.dumps(r)),
        error=lambda w, t: errors.append(w),
    )
    parts = [Part("a", 1, part(fail=True)), Part("b", 1, part(2.0)), Part("c", 100, part(3.0)), Part("d", 1, part(4.0))]
    result = budget.run_parts(ctx, parts)
    assert result["values"] == {"v": 4.0} and list(result["parts"]) == ["a", "b", "d"]
    assert result["parts"]["a"]["error"] == "ValueError: bad shape" and errors == ["a"] and result["ok"] is False
    assert result["skipped"] == {"c": "not started: 50 s left in the box, it takes about 100 s"}
    assert len(saved) == 3  # after every part that ran
    assert result["summary"].startswith("a FAILED (0 s), b ran (0 s), d ran (0 s); not started for lack of time: c")
    ctx.parts = ["b"]
    assert list(budget.run_parts(ctx, parts)["parts"]) == ["b"]


def _rows(labels_throughput: dict, **extra) -> list[dict]:
    return [{"label": k, "throughput": v, "status": "ok", **extra} for k, v in labels_throughput.items()]


def test_the_goal_parts_time_inline_against_its_softmax_twin_in_one_interleaved_run(monkeypatch, tmp_path):
    from inline_attn.bench import attention, model

    seen = []
    # the stand-ins take only what the real benchmarks take
    models_signature, attention_signature = map(inspect.signature, (model.bench_models, attention.bench_attention))

    def bench_models(cases, **kw):
        models_signature.bind(cases, **kw)
        seen.append((cases, kw))
        assert len({c.x for c in cases}) == 1  # one sweep point: timed together, interleaved
        speed = {"DeiT-T": 100.0, "InLine-DeiT-T": 90.0, "Swin-T w7": 100.0, "Swin-T w56": 50.0}
        speed.update({"InLine-Swin-T w7": 120.0, "InLine-Swin-T w56": 150.0})
        return {"rows": _rows({c.label: speed[c.label] for c in cases}), "meta": {"why_not_graphed": None}}

    def bench_attention(sizes, kinds, cuda_graphs, **kw):
        attention_signature.bind(sizes, kinds, cuda_graphs=cuda_graphs, **kw)
        chosen = triton_core._state["core_chosen"]  # the default: nothing chosen, so the tuning table applies
        layer_kernels.append(triton_core._state["core"] if chosen else "default")  # what the run's layers launch
        rows = [
            {
                "kind": k,
                "side": s,
                "status": "ok" if (s, cuda_graphs) != (14, True) else "OOM",
                "speedup_vs_softmax": 2.0 + cuda_graphs,
            }
            for s in sizes
            for k in kinds
        ]
        return {"rows": rows, "meta": {"why_not_graphed": None}}

    monkeypatch.setattr(model, "bench_models", bench_models)
    monkeypatch.setattr(attention, "bench_attention", bench_attention)
    monkeypatch.setattr(goals_step, "_model_backend", lambda case, batch: "cudnn")
    monkeypatch.setattr(goals_step, "_layer_backend", lambda side, batch: "flash")
    ctx = StepContext(tmp_path, False, time.time() + 100)
    deit = goals_step.part_deit(ctx)
    assert deit["values"] == {"deit_eager": 0.9, "deit_graphed": 0.9}
    assert deit["notes"]["deit_eager"] == "SDPA backend cudnn"
    twin = next(c for c in seen[0][0] if c.label == "DeiT-T")
    assert twin.name == "inline_deit_tiny" and twin.overrides == {"pattern": "S", "num_heads": 3}
    assert [kw["cuda_graphs"] for _, kw in seen] == [False, True] and seen[0][1]["batch"] == 128
    swin = goals_step.part_swin(ctx)
    assert swin["values"] == {"swin_published_eager": 1.5, "swin_w7_eager": 1.2, "swin_w56_eager": 3.0}
    assert [c.label for c in seen[-1][0]] == ["Swin-T w7", "InLine-Swin-T w7", "Swin-T w56", "InLine-Swin-T w56"]
    assert seen[-1][1]["cuda_graphs"] is False
    swin = goals_step.part_swin_graphed(ctx)
    assert swin["values"] == {"swin_published": 1.5, "swin_w7": 1.2, "swin_w56": 3.0}
    assert seen[-1][1]["cuda_graphs"] is True and all(r["graphed"] for r in swin["rows"])
    assert goals_step.part_deit1024(ctx)["values"] == {"deit1024": 0.9} and seen[-1][0][0].resolution == 1024
    layer_kernels = []
    layer = goals_step.part_layer(ctx)
    assert layer["values"]["layer56_eager"] == 2.0 and layer["values"]["layer56_graphed"] == 3.0
    assert layer["values"]["layer56_stream"] == 3.0 and layer_kernels == ["default", "default", "stream"]
    assert math.isnan(layer["values"]["layer14_graphed"])
    assert layer["notes"]["layer14_graphed"] == "SDPA backend flash; InLine layer: OOM"
    row = dict(batch=1024, launch="inline_fwd_resident", stream_launch="inline_fwd_stream", GBps=2500.0)
    core_rows = [
        {**row, "key": "7", "pct_of_copy": 62.0, "stream_pct_of_copy": 12.0, "sdpa_ratio": 2.5},
        {**row, "key": "56", "batch": 64, "pct_of_copy": 71.0, "stream_pct_of_copy": 15.0, "sdpa_ratio": 9.0},
    ]
    monkeypatch.setattr(goals_step, "core_shares", lambda: core_rows)
    core = goals_step.part_core(ctx)
    assert core["values"] == {"core7": 62.0, "core56": 71.0}
    other = "inline_fwd_resident; streaming kernels (inline_fwd_stream)"
    assert core["notes"] == {
        "core7": f"2500 GB/s, B 1024, {other} 12 %; SDPA's core 2.50x its time",
        "core56": f"2500 GB/s, B 64, {other} 15 %; SDPA's core 9.00x its time",
    }


def test_a_graphed_goal_is_not_met_by_steps_that_ran_ungraphed():
    value, note = goals_step._graphed(1.2, True, "capture failed: RuntimeError: x")
    assert math.isnan(value) and note == "not graphed: capture failed: RuntimeError: x"
    assert goals_step._graphed(1.2, False, None) == (1.2, "") == goals_step._graphed(1.2, True, None)


def test_a_failed_twin_leaves_the_ratio_unmeasured_and_says_why():
    value, why = goals_step._ratio(
        [{"label": "A", "throughput": 1.0, "status": "ok"}, {"label": "B", "throughput": math.nan, "status": "OOM"}],
        "A",
        "B",
    )
    assert math.isnan(value) and why == "B: OOM"


def test_kernel_stats_count_kernels_per_step_and_the_inline_kernels_time():
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def ev(name, us, dev=cuda):
        return SimpleNamespace(name=name, device_type=dev, self_device_time_total=us)

    events = [ev("aten::mm", 900.0, cpu), ev("inline_bwd_fused", 600.0), ev("inline_bwd_fused", 600.0)]
    events += [ev("predictor_bwd", 300.0), ev("sm90_gemm", 1000.0), ev("elementwise", 100.0)]
    stats = kernels.kernel_stats(events, steps=2, top=2)
    assert stats["gpu_busy_ms"] == pytest.approx(1.3) and stats["kernels"] == 2.5
    assert stats["inline_ms"] == pytest.approx(0.75)
    assert stats["top"] == [
        {"name": "inline_bwd_fused", "ms": pytest.approx(0.6), "calls": 1.0},
        {"name": "sm90_gemm", "ms": pytest.approx(0.5), "calls": 0.5},
    ]
    assert kernels.device_busy_ms(events) == pytest.approx(2.6)


def test_gpu_time_leaves_out_user_annotation_spans():
    # the optimizer's step is a user annotation on the GPU's timeline too, spanning AdamW's kernels
    # and the host gaps between them: counted, AdamW's time would be counted twice and the gaps with it
    cuda = torch.autograd.DeviceType.CUDA

    def ev(name, us, annotation=False):
        return SimpleNamespace(name=name, device_type=cuda, self_device_time_total=us, is_user_annotation=annotation)

    events = [ev("Optimizer.step#AdamW.step", 930.0, annotation=True), ev("multi_tensor_apply_kernel", 100.0)]
    events += [ev("inline_fwd_stream", 50.0), ev("ProfilerStep#3", 5000.0, annotation=True)]
    assert kernels.device_busy_ms(events) == pytest.approx(0.15)
    stats = kernels.kernel_stats(events, steps=1)
    assert stats["gpu_busy_ms"] == pytest.approx(0.15) and stats["kernels"] == 2
    assert [t["name"] for t in stats["top"]] == ["multi_tensor_apply_kernel", "inline_fwd_stream"]


def test_the_profile_gives_its_goal_values_and_the_summary_its_top_kernels(tmp_path):
    assert [label for label, _, _ in profile_step.MODELS] == [
        "InLine-DeiT-T",
        "DeiT-T",
        "InLine-Swin-T",
        "InLine-PVT-T",
        "InLine-CSwin-T",
    ]
    assert set(profile_step.GOAL_VALUES) == {"InLine-DeiT-T", "InLine-CSwin-T"}
    top = [{"name": "inline_bwd_fused", "ms": 1.99, "calls": 12.0}]
    part = {
        "model": "InLine-DeiT-T",
        "step_ms": 32.2,
        "gpu_busy_ms": 17.8,
        "busy_pct": 55.0,
        "kernels": 1302.0,
        "inline_ms": 3.87,
        "top": top,
    }
    results = {
        "profile": {"ok": True, "summary": "s", "parts": {"inline-deit-t": part}, "values": {"inline_kernels_ms": 3.87}}
    }
    text = output.save(tmp_path, {"device": "H200"}, results, ["--steps", "profile"])
    assert "| InLine-DeiT-T | 32.2 | 17.8 | 55 | 1302 | 3.87 |" in text
    assert "| inline_bwd_fused | 1.990 | 12.0 |" in text
    assert "| InLine kernels' GPU ms, InLine-DeiT-T, B 128 | 3.87 ms | <= 0.50 ms | missed | H200 |" in text
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["results"]["profile"]["parts"]["inline-deit-t"]["top"] == top


# the profile's GPU parts replaced on the CPU: a small model, small images, fixed kernel statistics and
# step times (eager 136.6 ms, graphed 66.0 ms, 59.7 ms of kernels: InLine-CSwin-T's run C and a graphed goal)
PROFILED = {"gpu_busy_ms": 59.7, "kernels": 3242.0, "inline_ms": 3.32, "top": []}
STEP_MS = {"eager": 136.6, "graphed": 66.0}


def _small_model(name, **overrides):
    conv = torch.nn.Conv2d(3, 8, 3, stride=2)
    return torch.nn.Sequential(
        conv, torch.nn.GELU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 1000)
    )


@pytest.fixture
def profile_on_cpu(monkeypatch):
    """profile_model on the CPU: its model, images and profiler replaced; ``timed`` lists which steps
    were timed (each stand-in timing runs its step twice)."""
    import inline_attn

    monkeypatch.setattr(inline_attn, "create_model", _small_model)
    monkeypatch.setattr(profile_step, "BATCH", 4)
    monkeypatch.setattr(profile_step, "RESOLUTION", 16)
    monkeypatch.setattr(profile_step, "profiled_stats", lambda step: (step(), (dict(PROFILED), "table"))[1])
    timed = []

    def timed_ms(step, label, device):
        kind = "eager" if not timed else "graphed"
        timed.append(kind)
        step(), step()
        return STEP_MS[kind], "ok"

    monkeypatch.setattr(profile_step, "timed_ms", timed_ms)
    return timed


def _profile_cswin(tmp_path, capture_fn=None) -> dict:
    from inline_attn.runtime.graphs import eager_capture

    ctx = StepContext(out=tmp_path, quick=True, deadline=time.time() + 60)
    label, name, overrides = profile_step.MODELS[-1]
    assert label == "InLine-CSwin-T"
    return profile_step.profile_model(ctx, label, name, overrides, device="cpu", capture_fn=capture_fn or eager_capture)


def test_the_profiles_step_is_the_trainers_with_its_optimizer(monkeypatch):
    from inline_attn.runtime import optim

    built = []

    def build_optimizer(model, opt, lr, weight_decay, *args, **kwargs):
        built.append((model, opt, lr, weight_decay, args, kwargs))
        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)

    monkeypatch.setattr(optim, "build_optimizer", build_optimizer)
    monkeypatch.setattr(profile_step, "BATCH", 3)
    monkeypatch.setattr(profile_step, "RESOLUTION", 16)
    model = _small_model("x")
    before = [p.detach().clone() for p in model.parameters()]
    opt, x, target, step = profile_step.trainer_step(model, "cpu")
    assert built == [(model, "adamw", profile_step.LR, profile_step.WEIGHT_DECAY, (), {})]
    assert opt.param_groups[0]["lr"] == 1e-3 and opt.param_groups[0]["weight_decay"] == 0.05
    assert x.shape == (3, 3, 16, 16) and target.shape == (3,) and target.dtype == torch.long
    loss = step()
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert all(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))  # AdamW stepped
    assert len(opt.state) == len(before)


def test_the_cswin_goal_is_the_graphed_steps_busy_share_with_the_eager_one_beside_it(
    tmp_path, monkeypatch, profile_on_cpu, capturable_on_cpu
):
    monkeypatch.setattr(profile_step, "why_not_graphed", lambda *a, **kw: None)  # as on a GPU
    row = _profile_cswin(tmp_path)
    assert profile_on_cpu == ["eager", "graphed"]
    assert row["step_ms"] == 136.6 and row["graphed_step_ms"] == 66.0 and "why_not_graphed" not in row
    assert row["busy_pct"] == pytest.approx(100 * 59.7 / 136.6)
    assert row["graphed_busy_pct"] == pytest.approx(100 * 59.7 / 66.0)
    assert row["values"] == {"cswin_busy_pct": row["graphed_busy_pct"], "cswin_busy_pct_eager": row["busy_pct"]}
    assert row["notes"] == {}
    assert profile_step.busy_line([row]) == "InLine-CSwin-T 44 % eager, 90 % graphed"
    assert (
        "136.60 ms a step eager, GPU busy 59.70 ms; 66.00 ms a step CUDA-graphed"
        in (tmp_path / "profile.txt").read_text()
    )
    results = {"profile": {"ok": True, "summary": "s", "parts": {"inline-cswin-t": row}, "values": row["values"]}}
    text = output.save(tmp_path, {"device": "H200"}, results, ["--steps", "profile"])
    graphed = "InLine-CSwin-T: GPU-busy share of a step, the trainer's default GPU path (CUDA-graphed, fused AdamW)"
    assert f"| {graphed}, B 128 | 90 % | >= 90 % | met | H200 |" in text
    assert (
        "| InLine-CSwin-T: GPU-busy share of an eager step (fused AdamW), B 128 | 44 % | (>= 90 %) | reported | H200 |"
        in text
    )
    assert "| InLine-CSwin-T | 136.6 | 59.7 | 44 | 3242 | 3.32 | 66.0 | 90 |" in text


def test_a_model_that_cannot_be_graphed_says_why_and_gives_no_graphed_value(tmp_path, monkeypatch, profile_on_cpu):
    label, name, overrides = profile_step.MODELS[-1]
    on_cpu = functools.partial(profile_step.profile_model, label=label, name=name, overrides=overrides, device="cpu")
    monkeypatch.setattr(profile_step, "PARTS", (Part("inline-cswin-t", 1, on_cpu),))
    result = profile_step.run(StepContext(out=tmp_path, quick=True, deadline=time.time() + 60))
    assert result["ok"] and result["summary"].endswith("; GPU busy: InLine-CSwin-T 44 % eager, not graphed")
    row = result["parts"]["inline-cswin-t"]  # on the CPU: why_not_graphed gives its reason
    assert profile_on_cpu == ["eager"]  # no step timed under the graphed label
    assert row["why_not_graphed"] == "CUDA graphs need a CUDA device, the step runs on cpu"
    assert "graphed_step_ms" not in row and "graphed_busy_pct" not in row
    values = result["values"]
    assert math.isnan(values["cswin_busy_pct"]) and values["cswin_busy_pct_eager"] == row["busy_pct"]
    assert result["notes"] == {"cswin_busy_pct": "not graphed: CUDA graphs need a CUDA device, the step runs on cpu"}
    text = output.save(tmp_path, {"device": "H200"}, {"profile": result}, ["--steps", "profile"])
    goal = next(line for line in text.splitlines() if "the trainer's default GPU path" in line)
    assert "| not measured | >= 90 % | - | H200 | not graphed: CUDA graphs need a CUDA device" in goal
    assert "| InLine-CSwin-T | 136.6 | 59.7 | 44 | 3242 | 3.32 | - | - |" in text
    assert "InLine-CSwin-T: not graphed: CUDA graphs need a CUDA device, the step runs on cpu" in text


def test_a_failed_capture_is_a_reason_not_an_eager_time(tmp_path, monkeypatch, profile_on_cpu, capturable_on_cpu):
    monkeypatch.setattr(profile_step, "why_not_graphed", lambda *a, **kw: None)

    def failing_capture(fn, *, warmup=3, pool=None):
        fn()
        raise RuntimeError("operation not permitted when stream is capturing")

    row = _profile_cswin(tmp_path, capture_fn=failing_capture)
    assert profile_on_cpu == ["eager"]
    assert row["why_not_graphed"] == "capture failed: RuntimeError: operation not permitted when stream is capturing"
    assert math.isnan(row["values"]["cswin_busy_pct"]) and "graphed_step_ms" not in row


def test_tests_step_compiles_in_parallel_workers_when_xdist_is_there():
    serial = tests_step.tests_command(["tests/gpu"], quick=False, xdist=False)
    parallel = tests_step.tests_command(["tests/gpu"], quick=True, xdist=True)
    assert "-n" not in serial and serial[-1] == "tests/gpu"
    assert parallel[parallel.index("-n") + 1] == str(tests_step.workers()) and "-x" in parallel
    assert tests_step.TEST_FILES[0] == "tests/ops/test_triton.py"  # the default kernels, first
    log = "x\nFAILED tests/gpu/test_a.py::test_b - RuntimeError\nERROR tests/ops/test_c.py\n1 failed, 1 error"
    assert tests_step.failures(log) == [
        "FAILED tests/gpu/test_a.py::test_b - RuntimeError",
        "ERROR tests/ops/test_c.py",
    ]


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_run_interruptible_returns_the_exit_status_of_a_run_that_ends(tmp_path):
    log = tmp_path / "log"
    assert tests_step.run_interruptible(_child("print('done'); raise SystemExit(3)"), log, timeout_s=30) == 3
    assert log.read_text() == "done\n"


SLEEPER = (
    "import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    print('2 passed, 1 failed (interrupted)')"
)


def test_run_interruptible_interrupts_and_keeps_what_the_run_reports_on_ctrl_c(tmp_path):
    log = tmp_path / "log"
    # the interrupt must come after the child's handler is installed (a margin for a loaded machine)
    assert tests_step.run_interruptible(_child(SLEEPER), log, timeout_s=START_MARGIN_S) is None
    assert log.read_text() == "2 passed, 1 failed (interrupted)\n"


def test_run_interruptible_interrupts_a_child_of_a_background_job(tmp_path):
    # a shell without job control starts `make gpu-check &` with SIGINT ignored; the child must
    # still get the interrupt as KeyboardInterrupt
    import signal

    log = tmp_path / "log"
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert tests_step.run_interruptible(_child(SLEEPER), log, timeout_s=START_MARGIN_S, grace_s=5.0) is None
    finally:
        signal.signal(signal.SIGINT, old)
    assert log.read_text() == "2 passed, 1 failed (interrupted)\n"


def test_run_interruptible_kills_a_run_that_ignores_the_interrupt(tmp_path):
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)"
    t0 = time.time()
    assert tests_step.run_interruptible(_child(code), tmp_path / "log", timeout_s=START_MARGIN_S, grace_s=1.0) is None
    assert time.time() - t0 < 20 and (tmp_path / "log").read_text() == "up\n"


def test_an_interrupted_pytest_run_still_reports_its_counts(tmp_path):
    # what the tests step relies on: pytest prints the counts so far when it gets SIGINT
    (tmp_path / "test_sleepy.py").write_text("import time\ndef test_quick(): pass\ndef test_slow(): time.sleep(120)\n")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_sleepy.py")]
    log = tmp_path / "log"
    # pytest must be inside test_slow when interrupted
    assert tests_step.run_interruptible(cmd, log, timeout_s=4 * START_MARGIN_S, cwd=tmp_path) is None
    text = log.read_text()
    assert "KeyboardInterrupt" in text and text.strip().splitlines()[-1].startswith("1 passed")


def test_autotune_winners_are_the_fastest_choice_per_key_and_direction():
    inf = float("inf")
    fused, resident, stream = CoreChoice("fused", 4, 64), CoreChoice("resident", 4), CoreChoice("stream", 8, 32)
    timings = {
        (196, 32, 3): {
            "forward": {"default": 2e-3, fused: 1e-3, resident: 1.5e-3, stream: inf},
            "backward": {"default": 4e-3, fused: 3e-3, resident: 2e-3, stream: 2.5e-3},
        },
        (197, 32, 6): {d: {"default": 1e-3, stream: 0.5e-3, fused: 0.75e-3} for d in ("forward", "backward")},
        (49, 32, 3): {"forward": {"default": 1e-3, fused: 1e-3}, "backward": {"default": 1e-3, fused: inf}},
    }
    winners = autotune_step.pick_winners(timings, "NVIDIA H100", torch.bfloat16)
    times = dict(forward_default_ms=2.0, backward_default_ms=4.0, default_ms=6.0)
    assert winners == {
        "NVIDIA H100|256|32|3|bfloat16": {
            "forward": {"design": "fused", "BLOCK_N": 64, "num_warps": 4},
            "backward": {"design": "resident", "num_warps": 4},
            **dict(forward_ms=1.0, backward_ms=2.0, ms=3.0, **times),
        },
        # one choice both ways: one entry of it; the 49-token shape timed no backward: no entry
        "NVIDIA H100|256|32|6|bfloat16": {
            "design": "stream",
            "BLOCK_N": 32,
            "num_warps": 8,
            **dict(forward_ms=0.5, backward_ms=0.5, ms=1.0, forward_default_ms=1.0, backward_default_ms=1.0),
            "default_ms": 2.0,
        },
    }


def test_autotune_winners_round_trip_into_the_table_and_the_launchers_choice(tmp_path, monkeypatch):
    q = torch.empty(1, 1, 1)  # a CPU tensor: the interpreter's launches, tuned as a device named "interpreter"
    fused, resident = CoreChoice("fused", 2, 32), CoreChoice("resident", 8)
    timings = {(197, 32, 6): {"forward": {fused: 1e-3, resident: 2e-3}, "backward": {fused: 3e-3, resident: 2e-3}}}
    timings[(49, 32, 3)] = {d: {fused: 1e-3} for d in ("forward", "backward")}
    unrolled = CoreChoice("resident", 8, serial_taps=False)  # the forward's taps three at a time
    timings[(196, 32, 3)] = {"forward": {unrolled: 1e-3, fused: 2e-3}, "backward": {resident: 1e-3}}
    table = {"winners": autotune_step.pick_winners(timings, "interpreter", torch.float32)}
    path = tmp_path / "triton_tuning.json"
    path.write_text(json.dumps(table))
    monkeypatch.setattr(triton_core, "TUNING_FILE", path)
    assert triton_core._tuning_table(str(path)) == table["winners"]  # valid: read back as written
    assert triton_core.core_choice(q, 197, 32, 6) == fused
    assert triton_core.core_choice(q, 197, 32, 6, backward=True) == resident
    assert triton_core.tiling(q, 197, 32, 6) == (32, 2)  # the forward's fused tile
    assert triton_core.tiling(q, 197, 32, 6, backward=True) == (triton_core.BLOCK_N, triton_core.NUM_WARPS)
    assert triton_core.core_choice(q, 40, 32, 3, backward=True) == fused  # 40 tokens: the same bucket as 49
    assert triton_core.core_choice(q, 197, 32, 4) is None  # another key
    assert table["winners"]["interpreter|256|32|3|float32"]["forward"] == {
        "design": "resident",
        "num_warps": 8,
        "serial_taps": False,
    }
    assert triton_core.core_choice(q, 196, 32, 3) == unrolled


def test_autotune_candidates_cover_the_three_designs_where_they_fit():
    for backward in (False, True):
        designs = lambda n, d: sorted({c.design for c in autotune_step.candidates(n, d, backward)})  # noqa: E731
        assert designs(197, 32) == ["fused", "resident", "stream"]
        assert designs(196, 64) == ["fused", "stream"]  # 256 x 64: over the resident tile
        assert designs(3136, 32) == ["fused", "stream"]
        for n, d, _, _ in autotune_step.SHAPES:
            block_d = max(16, 1 << (d - 1).bit_length())
            kept = {(c.design, block_d, c.block_n, c.num_warps) for c in autotune_step.candidates(n, d, backward)}
            assert not kept & autotune_step.SPILLING_SM90
    resident = lambda n, backward: [  # noqa: E731
        (c.num_warps, c.serial_taps) for c in autotune_step.candidates(n, 32, backward) if c.design == "resident"
    ]
    # fewer warps than the rule's spill at 256 x 32; the forward's taps both ways, the backward has none to choose
    assert resident(197, False) == [(8, False), (8, True)] and resident(197, True) == [(8, None)]
    assert [w for w, _ in resident(49, False)] == [2, 2, 4, 4, 8, 8]
    assert resident(49, True) == [(2, None), (4, None), (8, None)]
    assert (197, 32, 6, 128) in autotune_step.SHAPES  # InLine-DeiT-T's layer
    assert autotune_step.shape_args(197) == (14, 14, 1)


def _train_record(losses, graphed=None, steps=100, top1=80.0, ema=79.0):
    record = {"losses": losses, "val_top1": top1, "val_top1_ema": ema, "steps": steps}
    record["cuda_graphs"] = graphed or {"setting": False, "graphed": False, "why_not": None}
    return record


def test_train_step_compares_the_graphed_run_with_the_ungraphed_one():
    replayed = {"setting": True, "graphed": True, "why_not": None, "train_replays": 100, "eval_replays": 120}
    plain = _train_record([1.20, 0.80, 0.60, 0.55])
    good = train_step.compare_train_runs(plain, _train_record([1.21, 0.81, 0.60, 0.552], replayed, top1=79.2))
    assert good["ok"] and good["problems"] == [] and good["summary"].endswith(": pass")
    assert "largest gap 1.25 %" in good["summary"] and "100 training and 120 evaluation replays" in good["summary"]
    fell_back = {"setting": True, "graphed": False, "why_not": "capture failed: RuntimeError: x"}
    cases = [
        (_train_record([1.21, 0.81, 0.60, 0.55], fell_back), "the graphed run did not replay its steps"),
        (_train_record([1.21, 0.81, 0.60, 0.55], {**replayed, "train_replays": 98}), "did not replay"),
        (_train_record([1.20, 0.95, 0.60, 0.55], replayed), "train losses differ by up to 18.7 % (allowed 5 %)"),
        (_train_record([1.20, 1.20, 1.25, 1.30], replayed), "graphed run did not learn"),
        (_train_record([1.20, 0.80, 0.60, float("nan")], replayed), "graphed run did not learn"),
        (_train_record([1.20, 0.80, 0.60, 0.55], replayed, ema=60.0), "val_top1_ema 79.0 ungraphed against 60.0"),
    ]
    for graphed, words in cases:
        verdict = train_step.compare_train_runs(plain, graphed)
        assert not verdict["ok"] and words in verdict["summary"] and "FAIL: " in verdict["summary"], words


def test_train_step_runs_the_demo_recipe_graphed_and_not(tmp_path):
    from inline_attn.cli import build_parser
    from inline_attn.cli.train import collect_overrides
    from inline_attn.train.config import Config

    for graphed in (False, True):
        cmd = train_step.train_command(tmp_path / "fm", tmp_path / "run", graphed)
        assert cmd[1:3] == ["-m", "inline_attn.cli"]
        args = build_parser().parse_args(cmd[3:])
        cfg = Config.load(args.config, collect_overrides(args))
        assert cfg.train.cuda_graphs is graphed and cfg.train.amp == "bf16" and cfg.train.device == "cuda"
        assert cfg.train.ema and cfg.optim.accum_steps == 1 and cfg.data.batch_size == 64
        assert cfg.data.subset // 64 * train_step.TRAIN_EPOCHS == 100  # steps of each run


def test_compile_times_both_models_eager_and_compiled_in_one_run_and_prints_both_ratios(monkeypatch, tmp_path):
    from inline_attn.bench import compiled

    signature, seen = inspect.signature(compiled.compile_ab), []

    def compile_ab(cases, **kw):
        signature.bind(cases, **kw)
        seen.append(([c.label for c in cases], kw["device"], kw["amp"], kw["batch"]))
        graphed = dict(graphed_img_s=120.0, ratio_graphed=110 / 120)
        rows = [
            dict(model="DeiT-T", eager_img_s=100.0, compiled_img_s=110.0, ratio=1.1, recompiles=0, **graphed),
            dict(model="InLine-DeiT-T", eager_img_s=100.0, compiled_img_s=80.0, ratio=0.8, recompiles=0),
        ]
        rows[1].update(graphed_img_s=100.0, ratio_graphed=0.8)
        return {"rows": rows, "meta": {"why_not_graphed": None}}

    monkeypatch.setattr(compiled, "compile_ab", compile_ab)
    result = compile_step.run(StepContext(tmp_path, True, time.time() + 1000))
    assert seen == [(["DeiT-T", "InLine-DeiT-T"], "cuda", "bf16", 128)]  # one interleaved run of both
    assert result["values"] == {"compile_inline": 0.8, "compile_inline_eager": 0.8}
    both = "DeiT-T compiled / eager 1.10x, / eager-graphed 0.92x; "
    both += "InLine-DeiT-T compiled / eager 0.80x, / eager-graphed 0.80x"
    note = f"80 against 100 img/s graphed, 100 eager; {both}; 0 graphs compiled while timed"
    assert result["notes"]["compile_inline"] == note
    assert result["summary"].endswith("DeiT-T compiled / eager 1.10x, InLine-DeiT-T compiled / eager 0.80x")


def test_the_dry_run_prints_the_plan_within_the_lease_and_writes_an_empty_summary(tmp_path, capsys):
    # the lease's script checked on the CPU: every default step's box, parts and test files, a total
    # within LEASE_SCRIPT_S, each part's usual seconds within its step's box, the goal table rendered
    assert runner.main(["--dry-run", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == "tests: box 175 s" and "  tests/ops/test_triton_stream.py" in text
    assert "  core: about 10 s" in text and "  inline-cswin-t: about 20 s" in text
    total = int(text.rsplit("total: at most ", 1)[1].split(" s")[0])
    assert total <= runner.LEASE_SCRIPT_S == 480
    summary = (tmp_path / "summary.md").read_text()
    assert summary.count("not measured") == len(goals.GOALS)


def test_the_dry_run_names_a_plan_over_the_lease_and_a_part_that_does_not_fit_its_box(tmp_path):
    args = runner.parse_args(["--dry-run", "--budget-s", "900", "--steps", "tests", "goals", "compile", "autotune"])
    _, problems = runner.dry_run(args)
    assert problems == ["the plan takes up to 485 s, over the lease script's 480 s"]
    args = runner.parse_args(["--dry-run", "--budget-s", "130", "--steps", "goals"])
    _, problems = runner.dry_run(args)
    assert problems == []  # the goals' parts (89 s) fit a 90 s box
    args = runner.parse_args(["--dry-run", "--budget-s", "60", "--steps", "goals"])
    _, problems = runner.dry_run(args)
    assert problems == ["goals: its parts take about 89 s, over its box"]
    assert runner.main(["--dry-run", "--budget-s", "60", "--steps", "goals", "--out", str(tmp_path)]) == 1


def test_the_ncu_step_is_skipped_with_its_reason_where_ncu_is_missing(monkeypatch, tmp_path):
    from tools.gpu_check import ncu_step

    monkeypatch.setattr(ncu_step.shutil, "which", lambda name: None)
    result = ncu_step.run(StepContext(tmp_path, False, time.time() + 60))
    assert result == {"ok": None, "summary": "skipped: ncu (Nsight Compute) is not on this machine's PATH"}
    assert runner.STEPS["ncu"].default  # in the default plan, within its 8 minutes


def test_the_ncu_step_profiles_the_second_round_of_the_layers_kernels_and_reads_its_csv():
    from tools.gpu_check import ncu_step

    cmd = ncu_step.command("/out/ncu.csv")
    assert cmd[0] == "ncu" and cmd[-2:] == ["-m", "tools.gpu_check.ncu_step"]
    assert cmd[cmd.index("--launch-skip") + 1] == cmd[cmd.index("--launch-count") + 1] == "6"  # both core designs
    head = '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
    rows = [
        ("0", "inline_fwd_stream", "Launch Statistics", "Registers Per Thread", "register/thread", "80"),
        ("0", "inline_fwd_stream", "Occupancy", "Achieved Occupancy", "%", "35.2"),
        ("0", "inline_fwd_stream", "GPU Speed Of Light Throughput", "Duration", "us", "41.5"),
        ("1", "inline_bwd_stream", "Occupancy", "Theoretical Occupancy", "%", "25"),
        ("2", "inline_fwd_resident", "Command line profiler metrics", ncu_step.STALLS[0], "%", "31.5"),
    ]
    text = "==PROF== a line before the table\n" + head + "".join(",".join(f'"{x}"' for x in r) + "\n" for r in rows)
    assert ncu_step.parse(text) == {
        "inline_fwd_stream": {"registers": "80 register/thread", "occupancy": "35.2 %", "duration": "41.5 us"},
        "inline_fwd_resident": {"barrier stalls": "31.5 %"},
    }
    # the stall reasons by their metric names, beside the sections
    assert cmd[cmd.index("--metrics") + 1].split(",") == ncu_step.STALLS and len(ncu_step.STALLS) == 4


def _fake_ncu(monkeypatch, refuse_metrics: bool, returncode: int = 0):
    """ncu_step.run's subprocess as an ncu that writes one kernel's row (and, with refuse_metrics,
    first refuses the stall metrics); returns the command lines it was given."""
    from tools.gpu_check import ncu_step

    calls = []
    row = '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
    row += '"0","inline_fwd_resident","Occupancy","Achieved Occupancy","%","30.1"\n'

    def run(cmd, **kw):
        calls.append(cmd)
        log = pathlib.Path(cmd[cmd.index("--log-file") + 1])
        if refuse_metrics and "--metrics" in cmd:
            log.write_text("==ERROR== Failed to find metric smsp__warp_issue_stalled_barrier_per_warp_active.pct\n")
            return subprocess.CompletedProcess(cmd, 1, "", "")
        if returncode:
            return subprocess.CompletedProcess(cmd, returncode, "", "==ERROR== the profiler crashed")
        log.write_text(row)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(ncu_step.shutil, "which", lambda name: "/usr/bin/ncu")
    monkeypatch.setattr(ncu_step.subprocess, "run", run)
    return calls


def test_the_ncu_step_profiles_without_the_stall_reasons_where_ncu_refuses_their_metrics(monkeypatch, tmp_path):
    from tools.gpu_check import ncu_step

    errors = []
    ctx = StepContext(tmp_path, False, time.time() + 60, error=lambda where, text: errors.append(text))
    calls = _fake_ncu(monkeypatch, refuse_metrics=True)
    result = ncu_step.run(ctx)
    assert ["--metrics" in c for c in calls] == [True, False]
    assert result["ok"] and result["kernels"] == {"inline_fwd_resident": {"occupancy": "30.1 %"}}
    assert "without the stall reasons" in result["summary"] and "Failed to find metric" in errors[0]
    calls = _fake_ncu(monkeypatch, refuse_metrics=False, returncode=3)  # any other failure: no second run
    result = ncu_step.run(ctx)
    assert len(calls) == 1 and result == {"ok": False, "summary": "ncu exited 3 (errors.txt)"}


def test_autotune_times_each_distinct_launch_once_and_gives_fallbacks_its_time(monkeypatch, tmp_path):
    from inline_attn.bench import timing
    from inline_attn.bench.host import stubbed_triton_launches

    timed = []

    def fake_time_interleaved(cases, **kw):  # a case's time: 1 ms + 0.01 ms per its place
        timed.append(list(cases))
        return {label: timing.CaseTiming([1e-3 + 1e-5 * i]) for i, label in enumerate(cases)}

    monkeypatch.setattr(timing, "time_interleaved", fake_time_interleaved)
    monkeypatch.setattr(triton_core, "_plans", {})
    # 2 samples of 600 tokens, 2 heads of 32 (CPU tensors, the kernels stubbed out): too few pairs for
    # the interpreter's 4 multiprocessors, so every choice but a fused tile runs the split launch at the defaults
    q = torch.randn(2, 600, 64)
    taps = torch.randn(2, 9, 64)
    ctx = StepContext(tmp_path, False, time.time() + 100)
    with stubbed_triton_launches():
        step = lambda: triton_core.inline_forward_triton(q, q, q, taps, 2, 0.5, 24, 25, 0)  # noqa: E731
        seconds = autotune_step._time_direction(ctx, step, 600, 32, backward=False)
    candidates = autotune_step.candidates(600, 32, backward=False)
    assert set(seconds) == {"default", *candidates}
    distinct = [c for c in candidates if c.design == "fused" and (c.block_n, c.num_warps) != (64, 2)]
    assert timed == [["default", *map(str, distinct)]]  # the stream choices and fused 64 x 2 launch as the default
    assert seconds[CoreChoice("stream", 8, 32)] == seconds[CoreChoice("fused", 2, 64)] == seconds["default"]
    assert len(set(seconds.values())) == 1 + len(distinct)
