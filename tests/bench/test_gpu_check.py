"""``make gpu-check`` on a machine without CUDA, and its report from recorded results."""

from __future__ import annotations

import json
import subprocess

import torch

from inline_attn.bench import gpu_check


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
