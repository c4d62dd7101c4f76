"""The one run checkpoint: classification, segmentation and detection save the same run entries
(each task's own beside them), and a checkpoint written before ``rank_states`` (a dense run's torch
RNG states under ``rng``) still resumes, bit-exact."""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

from inline_attn.dense.config import DetConfig, SegConfig
from inline_attn.dense.det_task import DetTask
from inline_attn.dense.seg_task import SegTask
from inline_attn.runtime.run import train
from inline_attn.train.config import Config
from inline_attn.train.task import ClassifyTask

from seg_helpers import make_ade
from test_det_train import tiny as det_overrides
from test_seg_train import tiny_overrides as seg_overrides

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "train"))
from train_helpers import base_overrides, make_fmnist, make_folder  # noqa: E402

# what every run checkpoint holds, whatever the task (runtime.run.Run.checkpoint)
RUN_ENTRIES = {
    "model",
    "optimizer",
    "scheduler",
    "scaler",
    "model_ema",
    "step",
    "history",
    "config",
    "rank_states",
    "elapsed_s",
    "world_size",
}


def _read(path: pathlib.Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.fixture
def three_runs(tmp_path) -> dict:
    """A checkpoint of each task after two steps."""
    imgs = make_folder(tmp_path / "imgs", per_class=2)
    cls = {"data.path": str(imgs), "data.img_size": 16, "sched.epochs": 1, "sched.warmup_epochs": 0}
    train(ClassifyTask(), Config.load(None, base_overrides(tmp_path / "cls", **cls)))
    ade = str(make_ade(tmp_path / "ade", n_train=4, n_val=2))
    train(SegTask(), SegConfig.load(overrides=seg_overrides(tmp_path / "seg", **{"data.path": ade, "sched.iters": 2})))
    fm = make_fmnist(tmp_path / "fm", n_train=20, n_test=10)
    train(DetTask(), DetConfig.load(None, det_overrides(tmp_path / "det", fm, **{"sched.iters": 2})))
    return {task: _read(tmp_path / task / "last.pth") for task in ("cls", "seg", "det")}


def test_the_three_tasks_save_the_same_run_entries(three_runs):
    common = set.intersection(*(set(state) for state in three_runs.values()))
    assert common == RUN_ENTRIES
    for task, state in three_runs.items():
        ranks = state["rank_states"]
        assert len(ranks) == 1 and {"torch", "numpy", "python"} <= set(ranks[0]["rng"]), task
        assert state["world_size"] == 1 and state["step"] >= 1, task
    assert set(three_runs["cls"]) - RUN_ENTRIES >= {"epoch", "step_in_epoch", "steps_per_epoch"}
    assert set(three_runs["seg"]) - RUN_ENTRIES == {"num_classes", "classes"}
    assert set(three_runs["det"]) - RUN_ENTRIES == {"num_classes", "classes", "detector"}


def test_a_dense_checkpoint_of_the_earlier_format_resumes_bit_exact(tmp_path):
    ade = str(make_ade(tmp_path / "ade", n_train=4, n_val=2))

    def cfg(out, **extra):
        return SegConfig.load(overrides=seg_overrides(out, **{"data.path": ade, "sched.iters": 4, **extra}))

    train(SegTask(), cfg(tmp_path / "full"))
    train(SegTask(), cfg(tmp_path / "cut", **{"train.max_steps": 2}))
    # rewrite the cut run's checkpoint as the earlier code wrote it: each process's torch RNG state
    # under "rng", no rank_states, no model_ema
    path = tmp_path / "cut" / "last.pth"
    state = _read(path)
    state["rng"] = [state.pop("rank_states")[0]["rng"]["torch"]]
    del state["model_ema"]
    torch.save(state, path)
    resumed = train(SegTask(), cfg(tmp_path / "cut", **{"train.resume": "auto"}))
    assert resumed["steps"] == 4
    a, b = _read(tmp_path / "full" / "last.pth"), _read(path)
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert [r["loss"] for r in a["history"]] == [r["loss"] for r in b["history"]]


def test_a_dense_checkpoint_of_other_classes_is_refused_saying_how_to_proceed():
    from types import SimpleNamespace

    run = SimpleNamespace(train_set=SimpleNamespace(num_classes=11))
    SegTask().load_extra_state(run, "checkpoint 'x'", {"num_classes": 11})  # fits: nothing to say
    with pytest.raises(ValueError, match=r"predicts 150 classes, the training data has 11; .*another train.output"):
        DetTask().load_extra_state(run, "checkpoint 'x'", {"num_classes": 150})
