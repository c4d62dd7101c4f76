"""The ablation runner: plan, resume / skip on a two-run toy budget, statistics and verdicts."""

from __future__ import annotations

import json

import pytest
from train_helpers import make_fmnist

from inline_attn.experiments import ablations
from inline_attn.train import task as task_mod
from inline_attn.experiments.ablations import Budget, compare, fmt, plan, run_ablations, verdict

TOY = Budget(
    subset=128, val_subset=8, epochs=1, fmnist_epochs=1, fmnist_subset=128, mask_images=4, bench_batch=4, bench_iters=1
)


@pytest.fixture
def two_runs(tmp_path, monkeypatch):
    """Part g cut to two settings, one seed, two optimizer steps per run
    (128 images, batch 64): a two-run plan on generated Fashion-MNIST files."""
    monkeypatch.setenv("INLINE_ATTN_FMNIST", str(make_fmnist(tmp_path / "fm", n_train=128, n_test=8)))
    monkeypatch.setattr(ablations.settings, "FMNIST_VARIANTS", ("softmax", "inline"))
    calls = []
    real = task_mod.train

    def counting(cfg):
        calls.append(cfg.train.output)
        return real(cfg)

    monkeypatch.setattr(task_mod, "train", counting)
    kw = dict(output=str(tmp_path / "out"), parts="g", seeds=1, budget=TOY)
    return kw, calls, tmp_path


def test_finished_runs_are_skipped_and_the_rest_resumes(two_runs):
    kw, calls, tmp = two_runs
    first = run_ablations("quick", max_runs=1, progress=False, **kw)
    assert (first["trained"], first["skipped"], first["left"]) == (1, 0, 1)
    results = sorted((tmp / "out" / "results").glob("*.json"))
    assert [p.name for p in results] == ["fmnist-softmax__seed0.json"]
    rec = json.loads(results[0].read_text())
    assert rec["seed"] == 0 and rec["epochs"] == 1 and 0 <= rec["top1"] <= 100

    with pytest.raises(ValueError, match=f"output folder {tmp / 'out'} holds a finished or interrupted run"):
        run_ablations("quick", progress=False, **kw)  # a new campaign into the folder of this one
    second = run_ablations("quick", progress=False, resume="auto", **kw)
    assert (second["trained"], second["skipped"], second["left"]) == (1, 1, 0)
    third = run_ablations("quick", progress=False, resume="auto", **kw)
    assert (third["trained"], third["skipped"], third["left"]) == (0, 2, 0)
    assert len(calls) == 2 and len(set(calls)) == 2  # each run trained exactly once

    report = (tmp / "out" / "report.md").read_text()  # the report, in the output folder
    assert report == third["report"] and report.startswith("### The quick preset")
    assert "| softmax | " in report and "(n=1)" in report and "still to run: 0" in report


def test_a_stopped_run_leaves_no_result_and_is_trained_next_time(two_runs, monkeypatch):
    kw, calls, tmp = two_runs
    monkeypatch.setattr(task_mod, "train", lambda cfg: {"stopped": "signal", "signal": 15})
    res = run_ablations("quick", progress=False, **kw)
    assert res["stopped"] and res["signal"] == 15 and res["trained"] == 0 and res["left"] == 2
    assert not list((tmp / "out" / "results").glob("*.json"))


def test_a_diverged_run_is_a_result_shown_as_diverged(two_runs, monkeypatch):
    kw, calls, tmp = two_runs

    def diverge(cfg):
        raise FloatingPointError("loss is nan at epoch 0, step 1")

    monkeypatch.setattr(task_mod, "train", diverge)
    res = run_ablations("quick", progress=False, **kw)
    assert res["trained"] == 2 and res["left"] == 0
    assert "| softmax | diverged (1 of 1) |" in res["report"]
    assert fmt([None, 80.0, 82.0]) == "81.00 ± 1.41 (n=2; 1 diverged)"


def test_plan_shares_settings_between_parts_and_orders_seeds_inside():
    p = plan("abcdefg", range(3))
    keys = [s.key for s, _ in p]
    assert len(keys) == len(set((s.key, seed) for s, seed in p))  # no run twice
    assert len(set(keys)) == 31  # 10 (a) + 5 (b) + 3 (c) + 9 (d) + 4 (g)
    assert [seed for _, seed in p[:3]] == [0, 1, 2] and len(set(keys[:3])) == 1
    with pytest.raises(ValueError, match="expected letters of 'abcdefg'"):
        plan("az", range(1))
    with pytest.raises(ValueError, match="unknown preset"):
        run_ablations("huge")


def test_statistics_and_verdicts():
    assert fmt([1.0, 2.0, 3.0]) == "2.00 ± 1.00 (n=3)" and fmt([]) == "not run"
    assert compare([90.0, 90.5, 91.0], [80.0, 80.5, 81.0])[1] == "a"
    assert compare([80.0, 80.5, 81.0], [90.0, 90.5, 91.0])[1] == "b"
    assert compare([80.0, 85.0, 90.0], [84.0, 85.0, 86.0])[1] == "tie?"
    assert compare([90.0], [80.0])[1] == "tie?"  # one run a side is never clear
    assert verdict(["a", "a"]) == "agrees" and verdict(["a", "b"]) == "differs"
    assert verdict(["a", "tie?"]) == "inconclusive at this budget" and verdict([]) == "not run"
    assert compare([], [80.0, 81.0])[1] == "not run" and verdict(["not run", "not run"]) == "not run"
    assert verdict(["a", "not run"]) == "agrees"  # a comparison without runs neither supports nor refutes


def test_counted_verdict_lines_keep_the_wording_of_the_committed_tables():
    # docs/reproduction.md quotes these lines; the counts read "of <comparisons>"
    runs = {f"fmnist-{v}": [{"seed": i, "top1": 80.0 + i} for i in range(2)] for v in ablations.FMNIST_VARIANTS}
    runs["fmnist-inline"] = [{"seed": i, "top1": 90.0 + i} for i in range(2)]
    report = ablations.render("quick", "ag", 2, runs, {}, ablations.PRESETS["quick"], 0.0, 0, 0)
    assert (
        "- On the 7 x 7 Fashion-MNIST task InLine beats softmax, linear and InLine without residual: "
        "**agrees** (clear wins: 3 of 3, clear losses: 0)." in report
    )
    assert "- InLine beats linear attention for every kernel (Table 1): **not run** (clear wins: 0 of 5, " in report


def test_part_d_has_every_attention_kind_and_the_gpu_preset_is_ten_times_the_full_budget():
    from inline_attn.layers import ATTENTION_CHOICES
    from inline_attn.experiments.ablations import COMPARED, PRESETS, part_settings, render, swin_setting
    from inline_attn.experiments.ablations.runs import _budget_overrides

    assert set(COMPARED) == set(ATTENTION_CHOICES)
    assert {s.kind for s in part_settings("d")} >= {"agent", "polarity", "mlla"}
    gpu, full = PRESETS["gpu"], PRESETS["full"]
    assert gpu.epochs * (gpu.subset or 60000) >= 10 * full.epochs * full.subset
    ov = dict(_budget_overrides(swin_setting("mlla"), gpu))
    assert ov["train.device"] == "cuda" and ov["data.batch_size"] == 256 and ov["sched.epochs"] == 2
    assert "train.device" not in dict(_budget_overrides(swin_setting("mlla"), full))
    report = render("gpu", "abd", 3, {}, {}, gpu, 0.0, 72, 0)
    assert "inline-attn reproduce ablations --preset gpu --seeds 3 --parts abd" in report
    assert "#### Verdicts at this budget (2 epoch(s) of 60000 training images per run, data.batch_size=256" in report
    assert "| MLLA's linear attention | | | | | not run |" in report


def test_report_only_on_a_folder_without_runs_is_refused(tmp_path):
    # a mistyped --output with --report-only would report "Runs finished: 0"
    with pytest.raises(ValueError, match=r"no finished runs in .*typo.*results"):
        run_ablations("quick", output=str(tmp_path / "typo"), report_only=True, progress=False)
    assert not (tmp_path / "typo").exists()


@pytest.mark.parametrize(
    "argv, preset",
    [([], "full"), (["--quick"], "quick"), (["--preset", "gpu"], "gpu"), (["--preset", "quick"], "quick")],
)
def test_reproduce_command_takes_the_preset(argv, preset, monkeypatch):
    from inline_attn.cli import main

    seen = []

    def fake(p, **kw):
        seen.append(p)
        return {"report": "", "trained": 0, "skipped": 0, "left": 0, "stopped": False, "signal": None}

    monkeypatch.setattr(ablations, "run_ablations", fake)
    assert main(["reproduce", "ablations", *argv]) == 0
    assert seen == [preset]


def test_reproduce_command_refuses_quick_with_another_preset(capsys):
    from inline_attn.cli import main

    assert main(["reproduce", "ablations", "--quick", "--preset", "gpu"]) == 2
    assert "--quick is --preset quick" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, expected", [([], (None, False)), (["--resume", "auto"], ("auto", False)), (["--overwrite"], (None, True))]
)
def test_reproduce_command_passes_resume_and_overwrite(argv, expected, monkeypatch):
    from inline_attn.cli import main

    seen = []

    def fake(p, **kw):
        seen.append((kw["resume"], kw["overwrite"]))
        return {"report": "", "trained": 0, "skipped": 0, "left": 0, "stopped": False, "signal": None}

    monkeypatch.setattr(ablations, "run_ablations", fake)
    assert main(["reproduce", "ablations", *argv]) == 0
    assert seen == [expected]


def test_reproduce_fmnist_refuses_the_ablation_runner_flags(capsys):
    from inline_attn.cli import main

    for flag in (["--overwrite"], ["--resume", "auto"], ["--doc", "x.md"]):
        with pytest.raises(SystemExit) as stop:  # argparse refuses them: each target has its own flags
            main(["reproduce", "fmnist", *flag])
        assert stop.value.code == 2 and f"unrecognized arguments: {' '.join(flag)}" in capsys.readouterr().err


def test_report_only_refuses_overwrite(tmp_path):
    with pytest.raises(ValueError, match="--report-only .* cannot go with --overwrite"):
        run_ablations("quick", output=str(tmp_path), report_only=True, overwrite=True, progress=False)


@pytest.mark.parametrize(
    "argv, refused",
    [
        (["fmnist", "--seeds", "5"], "--seeds 5"),
        (["fmnist", "--parts", "g", "--max-runs", "-1"], "--parts g --max-runs -1"),
        (["fmnist", "--quick"], "--quick"),
        (["ablations", "--variants", "softmax"], "--variants softmax"),
        (["ablations", "--epochs", "2"], "--epochs 2"),
    ],
)
def test_reproduce_refuses_the_other_targets_options(argv, refused, capsys, monkeypatch):
    # each target is its own subcommand: argparse refuses the other's flags (never accepted and ignored)
    from inline_attn.cli import main

    monkeypatch.setattr(ablations, "run_ablations", lambda *a, **kw: pytest.fail("ran"))
    with pytest.raises(SystemExit) as stop:
        main(["reproduce", *argv])
    assert stop.value.code == 2 and f"unrecognized arguments: {refused}" in capsys.readouterr().err


def test_reproduce_ablations_honours_every_output_folder(monkeypatch):
    # an --output equal to fmnist's default folder was dropped for runs/ablations/<preset>
    from inline_attn.cli import main

    seen = {}

    def fake(preset, **kw):
        seen.update(kw)
        return {"report": "", "trained": 0, "skipped": 0, "left": 0, "stopped": False, "signal": None}

    monkeypatch.setattr(ablations, "run_ablations", fake)
    assert main(["reproduce", "ablations", "--output", "runs/fmnist"]) == 0
    assert seen["output"] == "runs/fmnist" and seen["seeds"] == 3 and seen["parts"] == "abcdefg"
    assert main(["reproduce", "ablations"]) == 0 and seen["output"] is None  # runs/ablations/<preset>
