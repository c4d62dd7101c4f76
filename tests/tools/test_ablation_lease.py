"""The lease preset of the ablations: the resident, CUDA-graphed run (graphs replaced by eager
execution here), its plan and resume, the launch counts, the report."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest
import torch

from inline_attn.experiments.ablations import ABLATION_CONFIG, Budget, swin_setting
from tools.ablations_lease import launches, lease, lease_report
from tools.ablations_lease.resident import ResidentData, ResidentRun, check_resident_recipe
from inline_attn.runtime.graphs import eager_capture
from inline_attn.train.config import Config, configs_dir

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "train"))
from train_helpers import make_fmnist  # noqa: E402

# a model a few times smaller than the task's, at 28 px: a step costs milliseconds
TINY = (
    ("model.kwargs.img_size", 28),
    ("data.img_size", 28),
    ("model.kwargs.embed_dim", 8),
    ("model.kwargs.depths", [1, 1, 1]),
    ("model.kwargs.window_size", 7),
)
TOY = Budget(8, 6, 1, 0, 0, 0, 0, 0, overrides=(("data.batch_size", 4),))  # 2 steps a run


@pytest.fixture
def fmnist(tmp_path):
    return make_fmnist(tmp_path / "fm", n_train=8, n_test=6)


def _run(fmnist, setting, capture_fn=None, extra=()):
    cfg = lease.run_config(setting, 0, TOY, fmnist, [*TINY, *extra])
    data = ResidentData.load(fmnist, cfg.data.subset, cfg.data.val_subset, torch.device("cpu"))
    return ResidentRun(cfg, data, torch.device("cpu"), capture_fn)


def test_the_plan_is_chunked_by_value_and_fits_in_eight_files():
    plan = lease.lease_plan(3)
    chunks = list(dict.fromkeys(c for c, _, _ in plan))
    assert chunks == ["lease-1-d.json", "lease-2-a.json", "lease-3-bc.json"] and len(chunks) + 1 <= 8
    assert [sum(1 for c, _, _ in plan if c == name) for name in chunks] == [33, 27, 21]
    ids = [lease.run_id(s, sd) for _, s, sd in plan]
    assert len(ids) == len(set(ids)) == 81  # a setting shared by two parts trains once
    assert lease.LEASE.epochs * 60000 >= 120000 and dict(lease.LEASE.overrides)["data.batch_size"] == 256


def test_dry_run_prints_the_chunks_and_their_estimates_and_writes_nothing(tmp_path, capsys):
    assert lease.main(["--output", str(tmp_path / "out"), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "lease-1-d.json: 33 runs, 0 finished, 33 to train, ~" in text and "with ~60 s of start-up" in text
    assert not (tmp_path / "out").exists()


def test_more_images_than_fashion_mnist_holds_are_refused_with_both_numbers(fmnist):
    """data.subset=9 of the 8 training images trained on 8 and reported the run as asked."""
    cpu = torch.device("cpu")
    with pytest.raises(ValueError) as e:
        ResidentData.load(fmnist, 9, 0, cpu)
    assert str(e.value) == (
        "data.subset=9 asks for the first 9 training images, but Fashion-MNIST's training split holds 8; "
        "give at most 8 (0: all)"
    )
    with pytest.raises(ValueError, match=r"data.val_subset=7 asks for the first 7 validation images, .* holds 6;"):
        ResidentData.load(fmnist, 0, 7, cpu)
    data = ResidentData.load(fmnist, 8, 3, cpu)  # the whole set, and fewer, are taken
    assert (len(data.train_labels), len(data.val_labels)) == (8, 3)


def test_the_replayed_step_trains_as_the_plain_step(fmnist):
    # hflip 0: the warm-up before capture draws no flips, so both runs see the same batches
    plain = _run(fmnist, swin_setting("inline"), extra=[("aug.hflip", 0.0)]).train(curve_points=2)
    graphed = _run(fmnist, swin_setting("inline"), eager_capture, [("aug.hflip", 0.0)]).train(curve_points=2)
    assert graphed["graphed"] and graphed["replays"] == 2 and not plain["graphed"]
    assert graphed["curve"]["train_loss"] == pytest.approx(plain["curve"]["train_loss"], rel=1e-5)
    assert graphed["curve"]["val_top1"] == plain["curve"]["val_top1"]


def test_the_resident_run_is_the_classification_trainers_recipe(fmnist, tmp_path):
    from inline_attn.train.task import train

    ov = [*TINY, ("aug.hflip", 0.0)]
    mine = _run(fmnist, swin_setting("linear"), extra=ov).train(curve_points=1)
    ov += [("train.output", str(tmp_path / "t")), ("train.device", "cpu")]
    theirs = train(lease.run_config(swin_setting("linear"), 0, TOY, fmnist, ov))["final"]
    assert mine["curve"]["train_loss"][0] == pytest.approx(theirs["train_loss"], rel=1e-4)
    assert mine["top1"] == pytest.approx(theirs["val_top1"], abs=0.01)


def test_a_tiny_lease_stops_at_its_limit_and_the_next_lease_continues_from_the_returned_files(fmnist, tmp_path):
    kw = dict(device="cpu", data_path=fmnist, seeds=1, budget=TOY, overrides=TINY, capture_fn=eager_capture)
    kw.update(curve_points=2, say=lambda line: None)
    first = lease.run_lease(tmp_path / "lease1", max_runs=2, **kw)
    assert (first["trained"], first["stopped"]) == (2, "max runs")
    files = sorted(p.name for p in (tmp_path / "lease1").iterdir())
    assert files == ["lease-1-d.json", "lease-2-a.json", "lease-3-bc.json", "lease-log.json"]
    chunk = json.loads((tmp_path / "lease1" / "lease-1-d.json").read_text())
    assert sorted(chunk["runs"]) == ["inline-identity-w28-res__seed0", "softmax-w28__seed0"]
    rec = chunk["runs"]["softmax-w28__seed0"]
    assert rec["graphed"] and rec["curve"]["images"] == [4, 8] and 0 <= rec["top1"] <= 100 and rec["macs"] > 0

    second = lease.run_lease(tmp_path / "lease2", resume_from=[tmp_path / "lease1"], max_runs=1, **kw)
    assert second["trained"] == 1 and second["left"] == 27 - 3
    runs = json.loads((tmp_path / "lease2" / "lease-1-d.json").read_text())["runs"]
    assert set(runs) == set(chunk["runs"]) | {"linear-relu-w28__seed0"}  # the earlier records come along
    log = json.loads((tmp_path / "lease2" / "lease-log.json").read_text())["invocations"]
    assert [e["runs_trained"] for e in log] == [2, 1] and log[0]["device"] == "cpu"
    assert log[0]["graph_check"]["ok"] and log[0]["graph_check"]["flips_redrawn"]


def _baked(fn, *, warmup=3, pool=None):
    """A capture whose replays repeat the capture call's results: what a graph does with a draw made on the host."""
    out = fn()
    return (lambda: out), None


def test_the_graph_check_passes_a_faithful_capture_and_stops_a_lease_whose_graph_repeats_its_draws(fmnist, tmp_path):
    from tools.ablations_lease.resident import graph_check

    cfg = lease.run_config(swin_setting("inline"), 0, TOY, fmnist, [*TINY, ("aug.hflip", 0.0)])
    data = ResidentData.load(fmnist, cfg.data.subset, cfg.data.val_subset, torch.device("cpu"))
    good = graph_check(cfg, data, "cpu", eager_capture)
    assert good["ok"] and good["graphed"] and good["max_rel_diff"] <= 1e-5
    bad = graph_check(cfg, data, "cpu", _baked)
    assert not bad["flips_redrawn"] and not bad["ok"]

    kw = dict(device="cpu", data_path=fmnist, seeds=1, budget=TOY, overrides=TINY, say=lambda line: None)
    res = lease.run_lease(tmp_path / "out", capture_fn=_baked, **kw)
    assert res["trained"] == 0 and res["stopped"].startswith("graph check failed")
    log = json.loads((tmp_path / "out" / "lease-log.json").read_text())["invocations"]
    assert log[0]["stopped"].startswith("graph check failed") and not log[0]["graph_check"]["ok"]


def test_the_resident_step_refuses_what_it_does_not_implement():
    cfg = Config.load(configs_dir() / ABLATION_CONFIG, [("aug.mixup", 0.8)])
    with pytest.raises(ValueError, match=r"aug.mixup=0.8: the resident ablation step implements only aug.mixup=0.0"):
        check_resident_recipe(cfg)


def test_the_host_launches_a_handful_of_kernels_a_step_and_the_graph_holds_the_rest(fmnist):
    launch = launches.step_launches(lambda b: _run(fmnist, swin_setting("inline"), extra=[("data.batch_size", b)]), 256)
    assert launch["launches"] > 100 and launch["by_op"]["mm"] > 0 and "_local_scalar_dense" not in launch["by_op"]
    assert launches.graphed_step_ms(launch, "H200") < launches.graphed_step_ms(launch, "H100")
    host = launches.host_launches_per_step(_run(fmnist, swin_setting("inline")))
    assert host <= 6  # copy the indices in (2), keep the loss (1), the replay, the lr


def _fake_records() -> dict:
    """Every run of the plan: InLine at 90 %, every other attention at 80 % (+0.1 a seed), with curves."""
    out = {}
    for _, s, seed in lease.lease_plan(3):
        top1 = (90.0 if s.kind == "inline" else 80.0) + 0.1 * seed
        curve = {"images": [60000, 120000], "train_loss": [1.0, 0.8], "val_top1": [top1 - 5, top1]}
        out[lease.run_id(s, seed)] = {
            "setting": s.key, "label": s.label, "kind": s.kind, "seed": seed, "top1": top1, "params": 1000,
            "macs": 2e7, "train_img_s": 40000.0, "step_ms": 6.5, "graphed": True, "curve": curve,
        }  # fmt: skip
    return out


def test_the_report_sets_each_verdict_beside_the_cpu_presets_and_says_where_it_flips(tmp_path):
    root = pathlib.Path(__file__).resolve().parents[2]
    doc = tmp_path / "reproduction.md"
    doc.write_text((root / "docs" / "reproduction.md").read_text())
    out = tmp_path / "lease"
    out.mkdir()
    records = _fake_records()
    lease._write_all(out, lease.lease_plan(3), records)
    log = {"invocations": [{"started_utc": "2026-11-28 10:00:00", "device": "NVIDIA H100", "wall_s": 420.0,
                           "runs_trained": 81}]}  # fmt: skip
    (out / lease.LOG).write_text(json.dumps(log))
    before = doc.read_text()
    section = lease_report.write_lease_report([out], doc)
    assert "Device: NVIDIA H100. Runs finished: 81 of 81 (81 CUDA-graphed)" in section
    assert "| claim | full preset | quick preset | lease preset |" in section
    assert (
        "- **Flips**: InLine beats linear attention for every kernel (Table 1): **differs** at the full preset's "
        "budget, **agrees** at the lease's." in section
    )
    assert "**Flips**: The local residual helps InLine at every window size: **agrees**" in section
    text = doc.read_text()
    full = before[before.index("<!-- ablations:begin full -->") : before.index("<!-- ablations:end full -->")]
    assert full in text and text.count("<!-- ablations:begin lease -->") == 1  # the CPU presets' sections stay
    lease_part = text[text.index("<!-- ablations:begin lease -->") : text.index("<!-- ablations:end lease -->")]
    assert "Device: NVIDIA H100. Runs finished: 81 of 81" in lease_part  # the lease's section, written in place
    png = tmp_path / lease_report.FIGURE
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="no lease run records"):
        lease_report.write_lease_report([tmp_path / "typo"], doc)
    assert lease.main(["--output", str(out), "--report-only", "--doc", str(doc)]) == 0  # the documented command
    assert lease.main(["--output", str(out), "--report-only"]) == 2  # no --doc: said, nothing written


def test_a_lease_without_fashion_mnist_says_where_it_looked_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("INLINE_ATTN_FMNIST", str(tmp_path / "nothing"))
    monkeypatch.setattr(lease, "DEFAULT_FMNIST_DIR", str(tmp_path / "nor-here"))
    monkeypatch.setattr(lease, "configs_dir", lambda: tmp_path / "configs")
    with pytest.raises(ValueError, match=r"no Fashion-MNIST files .*nothing.*nor-here.*data/fashion-mnist"):
        lease.run_lease(tmp_path / "out", device="cpu", say=lambda line: None)
    assert not (tmp_path / "out").exists()


def test_a_run_whose_loss_turns_non_finite_is_recorded_as_diverged(fmnist, monkeypatch):
    from tools.ablations_lease import resident

    monkeypatch.setattr(resident, "_labelled_loss", lambda *a: lambda logits, idx: logits.sum() * float("nan"))
    rec = _run(fmnist, swin_setting("linear")).train(curve_points=2)
    assert rec["top1"] is None and rec["diverged"] == "training loss not finite by step 1 of 2"


def test_a_run_that_raises_is_logged_and_left_for_the_next_lease_and_three_in_a_row_end_it(
    fmnist, tmp_path, monkeypatch
):
    from tools.ablations_lease import resident

    real = resident.ResidentRun.train

    def train(self, **kw):
        if self.cfg.model.kwargs["pattern"] != "III":  # every attention but InLine runs out of resources
            raise RuntimeError("OutOfResources: shared memory, required: 250112\nTriton's details")
        return real(self, **kw)

    monkeypatch.setattr(resident.ResidentRun, "train", train)
    kw = dict(device="cpu", data_path=fmnist, seeds=1, budget=TOY, overrides=TINY, say=lambda line: None)
    res = lease.run_lease(tmp_path / "out", curve_points=1, **kw)
    assert res["trained"] == 1 and res["stopped"].startswith("3 runs failed in a row")
    log = json.loads((tmp_path / "out" / "lease-log.json").read_text())["invocations"][0]
    assert log["errors"][0] == {
        "run": "softmax-w28__seed0",
        "error": "RuntimeError: OutOfResources: shared memory, required: 250112",
    }
    runs = json.loads((tmp_path / "out" / "lease-1-d.json").read_text())["runs"]
    assert list(runs) == ["inline-identity-w28-res__seed0"]  # no record: the next lease trains the failed ones
