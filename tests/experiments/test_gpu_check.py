"""``make gpu-check`` on a machine without CUDA, and its report from recorded results."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile

import torch

from inline_attn.experiments import gpu_check


# seconds a child process gets to start before it is interrupted (margin for a loaded machine)
START_MARGIN_S = 3.0


def test_exits_at_once_without_cuda(capsys, tmp_path):
    if torch.cuda.is_available():
        return  # this machine has a GPU: the check would run for minutes
    assert gpu_check.main(["--out", str(tmp_path / "x")]) == 2
    assert "no CUDA device here" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_make_target_without_cuda():
    if torch.cuda.is_available():
        return
    proc = subprocess.run(
        ["make", "-s", "gpu-check", "GPU_PYTHON=python3"], capture_output=True, text=True, cwd=gpu_check.ROOT
    )
    assert proc.returncode != 0 and "no CUDA device here" in proc.stdout + proc.stderr


def test_goals_and_summary_from_results(tmp_path):
    results = {
        "core": {
            "ok": True,
            "seconds": 3,
            "summary": "s",
            "rows": [{"grid": "56x56", "GBps": 900.0, "pct_of_copy": 30.0}],
        },
        "layer": {
            "ok": True,
            "seconds": 5,
            "table": "TABLE",
            "rows": [
                {"side": 14, "kind": "inline", "mode": "fwd+bwd", "speedup_vs_softmax": 1.3},
                {"side": 56, "kind": "inline", "mode": "fwd+bwd", "speedup_vs_softmax": 3.0},
            ],
        },
        "window": {
            "ok": True,
            "seconds": 7,
            "rows": [
                {"x": 7, "label": "Swin-T", "mode": "train", "throughput": 100.0},
                {"x": 7, "label": "InLine-Swin-T", "mode": "train", "throughput": 95.0},
            ],
        },
        "train": {"ok": None, "seconds": 0, "summary": "skipped: no Fashion-MNIST files"},
    }
    lines = gpu_check.goals(results, 3e12)
    assert "Triton core fwd+bwd at 56x56: 900 GB/s = 30 % of the device copy rate (goal >= 60 %) MISSED" in lines
    assert "layer fwd+bwd vs SDPA at 14x14: 1.30x (goal >= 1.0x) met" in lines
    assert "layer fwd+bwd vs SDPA at 56x56: 3.00x (goal >= 4.0x) MISSED" in lines
    assert "InLine-Swin-T training throughput vs Swin-T at window 7: 0.95x (goal >= 1.0x) MISSED" in lines
    text = gpu_check.write_summary(tmp_path, {"device": "H100"}, results, lines, [])
    assert "| train | skipped |" in text and "TABLE" in text and (tmp_path / "summary.md").read_text() == text


def test_results_are_saved_after_each_step(tmp_path):
    # a run stopped by a time limit keeps the steps it finished: main() calls this after every step
    env = {"device": "H100", "copy_GBps": 3000}
    partial = {"train": {"ok": True, "seconds": 22, "summary": "200 bf16 steps"}}
    text = gpu_check.save_results(tmp_path, env, partial, ["--steps", "train", "core"])
    assert "| train | pass | 22 | 200 bf16 steps |" in text
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["results"] == partial and saved["env"] == env


def test_device_busy_counts_kernel_rows_only():
    from types import SimpleNamespace

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = [
        SimpleNamespace(device_type=cpu, self_device_time_total=400.0),  # an operator row repeats its kernel's time
        SimpleNamespace(device_type=cuda, self_device_time_total=400.0),
        SimpleNamespace(device_type=cuda, self_device_time_total=1100.0),
    ]
    assert gpu_check.device_busy_ms(events) == 1.5


def test_tests_step_compiles_in_parallel_workers_when_xdist_is_there(tmp_path):
    junit = tmp_path / "t.xml"
    serial = gpu_check.tests_command(junit, ["tests/gpu"], quick=False, xdist=False)
    parallel = gpu_check.tests_command(junit, ["tests/gpu"], quick=True, xdist=True)
    assert "-n" not in serial and serial[-1] == "tests/gpu"
    assert parallel[parallel.index("-n") + 1] == str(gpu_check.TESTS_WORKERS) and "-x" in parallel


def test_steps_start_only_while_their_usual_time_fits_and_the_tests_get_the_rest():
    assert gpu_check.plan_step("compile", gpu_check.STEP_SECONDS["compile"]) == (True, {})
    assert gpu_check.plan_step("compile", gpu_check.STEP_SECONDS["compile"] - 1) == (False, {})
    assert gpu_check.plan_step("tests", 200.0) == (True, {"timeout_s": 200.0})
    assert gpu_check.plan_step("tests", gpu_check.TESTS_MIN_S - 1)[0] is False
    # the tests run last: the benchmark steps are bounded, the tests' JIT compilation is not
    assert list(gpu_check.STEPS)[-1] == "tests" and set(gpu_check.STEP_SECONDS) == set(gpu_check.STEPS) - {"tests"}
    # everything but the tests fits the budget with room left for them
    assert sum(gpu_check.STEP_SECONDS.values()) + 150 <= gpu_check.BUDGET_S <= 480


def _child(code: str) -> list[str]:
    import sys

    return [sys.executable, "-c", code]


def test_run_interruptible_returns_the_exit_status_of_a_run_that_ends(tmp_path):
    log = tmp_path / "log"
    assert gpu_check.run_interruptible(_child("print('done'); raise SystemExit(3)"), log, timeout_s=30) == 3
    assert log.read_text() == "done\n"


def test_run_interruptible_interrupts_and_keeps_what_the_run_reports_on_ctrl_c(tmp_path):
    log = tmp_path / "log"
    code = (
        "import time\ntry:\n    time.sleep(60)\n"
        "except KeyboardInterrupt:\n    print('2 passed, 1 failed (interrupted)')"
    )
    # the interrupt must come after the child's handler is installed (a margin for a loaded machine)
    assert gpu_check.run_interruptible(_child(code), log, timeout_s=START_MARGIN_S) is None
    assert log.read_text() == "2 passed, 1 failed (interrupted)\n"


def test_run_interruptible_interrupts_a_child_of_a_background_job(tmp_path):
    # a shell without job control starts `make gpu-check &` with SIGINT ignored; the child must
    # still get the interrupt as KeyboardInterrupt (it did not: the fresh-clone run of .ci/run in
    # the background failed the test above with an empty log)
    import signal

    log = tmp_path / "log"
    code = (
        "import time\ntry:\n    time.sleep(60)\n"
        "except KeyboardInterrupt:\n    print('2 passed, 1 failed (interrupted)')"
    )
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert gpu_check.run_interruptible(_child(code), log, timeout_s=START_MARGIN_S, grace_s=5.0) is None
    finally:
        signal.signal(signal.SIGINT, old)
    assert log.read_text() == "2 passed, 1 failed (interrupted)\n"


def test_run_interruptible_kills_a_run_that_ignores_the_interrupt(tmp_path):
    import time

    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)"
    t0 = time.time()
    assert gpu_check.run_interruptible(_child(code), tmp_path / "log", timeout_s=START_MARGIN_S, grace_s=1.0) is None
    assert time.time() - t0 < 20 and (tmp_path / "log").read_text() == "up\n"


def test_an_interrupted_pytest_run_still_reports_its_counts(tmp_path):
    # what the tests step relies on: pytest prints the counts so far when it gets SIGINT
    import sys

    (tmp_path / "test_sleepy.py").write_text("import time\ndef test_quick(): pass\ndef test_slow(): time.sleep(120)\n")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_sleepy.py")]
    log = tmp_path / "log"
    # pytest must be inside test_slow when interrupted
    assert gpu_check.run_interruptible(cmd, log, timeout_s=4 * START_MARGIN_S, cwd=tmp_path) is None
    text = log.read_text()
    assert "KeyboardInterrupt" in text and text.strip().splitlines()[-1].startswith("1 passed")


def test_main_runs_the_steps_in_order_within_the_budget(tmp_path, monkeypatch):
    # main()'s orchestration with stand-in steps (the real ones need CUDA): the order, a step that
    # no longer fits the budget, and the tests' box being what is left
    import time

    calls = []

    def fake(name, seconds=0.0, ok=True):
        def step(out, quick, **kwargs):
            calls.append((name, kwargs))
            time.sleep(seconds)
            return {"ok": ok, "summary": f"{name} ran"}

        return step

    steps = {name: fake(name) for name in gpu_check.STEPS}
    steps["layer"] = fake("layer", seconds=1.0)
    steps["train"] = fake("train", ok=False)
    monkeypatch.setattr(gpu_check, "STEPS", steps)
    # every step usually takes 0 s but the window step 10 s; the tests need 0.5 s at least
    monkeypatch.setattr(gpu_check, "STEP_SECONDS", {**dict.fromkeys(gpu_check.STEP_SECONDS, 0), "window": 10})
    monkeypatch.setattr(gpu_check, "TESTS_MIN_S", 0.5)
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: True)
    # main() drops TRITON_INTERPRET for its CUDA kernels; this process's Triton tests need it back
    if "TRITON_INTERPRET" in os.environ:
        monkeypatch.setenv("TRITON_INTERPRET", os.environ["TRITON_INTERPRET"])
    versions = {"device": "stand-in", "driver": "-", "torch": torch.__version__, "triton": "-"}
    monkeypatch.setattr(gpu_check, "_versions", lambda: dict(versions))
    monkeypatch.setattr(gpu_check, "_copy_bandwidth", lambda: 3e12)
    out = tmp_path / "gc"
    asked = ["tests", "window", "layer", "train", "layer"]
    code = gpu_check.main(["--out", str(out), "--budget-s", "3", "--steps", *asked])
    assert [name for name, _ in calls] == ["train", "layer", "tests"]  # the canonical order, once each, window skipped
    assert 0.5 <= calls[-1][1]["timeout_s"] < 2.0  # what was left after the 1 s layer step
    saved = json.loads((out / "gpu_check.json").read_text())["results"]
    assert saved["window"]["ok"] is None and saved["window"]["summary"].startswith("not started: ")
    assert saved["window"]["summary"].endswith("s of the 3 s budget left")
    assert saved["train"]["ok"] is False and code == 1  # a failed step fails the check
    assert (tmp_path / "gc.tar.gz").is_file()


def test_goal_table_names_the_device_and_marks_each_goal():
    results = {
        "resolution": {
            "rows": [
                {"x": 224, "label": "DeiT-T", "mode": "train", "throughput": 100.0},
                {"x": 224, "label": "InLine-DeiT-T", "mode": "train", "throughput": 80.0},
            ]
        },
        "graphs": {
            "rows": [{"side": 14, "kind": "inline", "mode": "fwd+bwd", "speedup_vs_softmax": 1.2, "graphed": True}],
            "model_rows": [
                {"x": 224, "label": "DeiT-T", "throughput": 100.0, "graphed": True},
                {"x": 224, "label": "InLine-DeiT-T", "throughput": 104.0, "graphed": True},
            ],
        },
        "core": {"rows": [{"grid": "56x56", "pct_of_copy": 21.0}]},
    }
    table = gpu_check.goal_table(results, "NVIDIA H100 80GB HBM3")
    assert table.startswith("Goals of issue 23 on NVIDIA H100 80GB HBM3 (bf16):")
    assert "| InLine-DeiT-T / DeiT-T training, 224 px (B 64) | eager | 0.80x | >= 1x | FAIL |" in table
    assert "| InLine-DeiT-T / DeiT-T training, 224 px (B 128) | graphed | 1.04x | >= 1x | pass |" in table
    assert "| layer fwd+bwd / SDPA, 14x14 | graphed | 1.20x | >= 1x | pass |" in table
    assert "| InLine-Swin-T / Swin-T training, window 7 | eager | not measured | >= 1.15x | - |" in table
    assert "| Triton core fwd+bwd at 56x56, share of copy | eager | 21 % | >= 40 % | FAIL |" in table
    text = gpu_check.write_summary(pathlib.Path(tempfile.mkdtemp()), {"device": "H100"}, results, [], [])
    assert "Goals of issue 23 on H100" in text


def test_autotune_runs_on_demand_within_its_budget_before_the_tests():
    order = list(gpu_check.all_steps())
    assert order[-1] == "tests" and order.index("autotune") > order.index("graphs")
    assert "autotune" not in gpu_check.STEPS  # the default run keeps to the budget without the sweep
    start, kwargs = gpu_check.plan_step("autotune", gpu_check.ON_DEMAND_SECONDS["autotune"])
    assert start and kwargs["budget_s"] < gpu_check.ON_DEMAND_SECONDS["autotune"]
    assert gpu_check.plan_step("autotune", gpu_check.ON_DEMAND_SECONDS["autotune"] - 1)[0] is False


def test_autotune_winners_are_the_fastest_tiling_per_key():
    inf = float("inf")
    timings = {
        (196, 32, 3): {"default": 2e-3, (32, 2): 3e-3, (64, 4): 1e-3, (128, 8): inf},
        (49, 32, 3): {"default": 1e-3, (32, 2): inf},  # nothing compiled: no entry, the defaults stay
    }
    winners = gpu_check.pick_winners(timings, "NVIDIA H100", torch.bfloat16)
    assert winners == {"NVIDIA H100|256|32|3|bfloat16": {"BLOCK_N": 64, "num_warps": 4, "ms": 1.0, "default_ms": 2.0}}


def _train_record(losses, graphed=None, steps=100, top1=80.0, ema=79.0):
    record = {"losses": losses, "val_top1": top1, "val_top1_ema": ema, "steps": steps}
    record["cuda_graphs"] = graphed or {"setting": False, "graphed": False, "why_not": None}
    return record


def test_train_step_compares_the_graphed_run_with_the_ungraphed_one():
    replayed = {"setting": True, "graphed": True, "why_not": None, "train_replays": 100, "eval_replays": 120}
    plain = _train_record([1.20, 0.80, 0.60, 0.55])
    good = gpu_check.compare_train_runs(plain, _train_record([1.21, 0.81, 0.60, 0.552], replayed, top1=79.2))
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
        verdict = gpu_check.compare_train_runs(plain, graphed)
        assert not verdict["ok"] and words in verdict["summary"] and "FAIL: " in verdict["summary"], words


def test_train_step_runs_the_demo_recipe_graphed_and_not(tmp_path):
    from inline_attn.cli import build_parser
    from inline_attn.cli.train import collect_overrides
    from inline_attn.train.config import Config

    for graphed in (False, True):
        cmd = gpu_check._train_command(tmp_path / "fm", tmp_path / "run", graphed)
        assert cmd[1:3] == ["-m", "inline_attn.cli"]
        args = build_parser().parse_args(cmd[3:])
        cfg = Config.load(args.config, collect_overrides(args))
        assert cfg.train.cuda_graphs is graphed and cfg.train.amp == "bf16" and cfg.train.device == "cuda"
        assert cfg.train.ema and cfg.optim.accum_steps == 1 and cfg.data.batch_size == 64
        assert cfg.data.subset // 64 * gpu_check.TRAIN_EPOCHS == 100  # steps of each run
