"""Resuming: the previous checkpoint as fallback, clear errors for unreadable or mismatched
checkpoints, and a defined list of settings that may change."""

import logging

import pytest
import torch

from inline_attn.cli import main
from inline_attn.train import checkpoint as ckpt_io
from inline_attn.train.config import Config
from inline_attn.train.task import train

from train_helpers import base_overrides, make_folder


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A run of 2 epochs x 2 steps stopped after step 3: last.pth (step 3), previous.pth (epoch 1)."""
    tmp = tmp_path_factory.mktemp("resume")
    root = make_folder(tmp / "imgs", per_class=3)
    common = {"data.path": str(root), "data.img_size": 16, "sched.epochs": 2}
    out = tmp / "run"
    s = train(Config.load(None, base_overrides(out, **common, **{"train.max_steps": 3})))
    assert s["stopped"] == "max_steps" and s["steps"] == 3
    return tmp, out, common


def _copy_run(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def _resume(out, common, **extra):
    return train(Config.load(None, base_overrides(out, **{**common, "train.resume": "auto", **extra})))


def test_both_checkpoints_kept(interrupted):
    _, out, _ = interrupted
    last, prev = ckpt_io.load(out / "last.pth"), ckpt_io.load(out / "previous.pth")
    assert (last["step"], last["epoch"], last["step_in_epoch"]) == (3, 1, 1)
    assert (prev["step"], prev["epoch"], prev["step_in_epoch"]) == (2, 1, 0)


def test_unreadable_last_falls_back_to_previous(interrupted, tmp_path, caplog):
    _, src, common = interrupted
    out = _copy_run(src, tmp_path / "run")
    data = (out / "last.pth").read_bytes()
    (out / "last.pth").write_bytes(data[: len(data) // 2])  # a torn file
    with caplog.at_level(logging.WARNING, logger="inline_attn.runtime.checkpoint"):
        s = _resume(out, common, **{"data.workers": 0, "train.max_steps": 0})  # both may change
    assert "last.pth" in caplog.text and "truncated or corrupted" in caplog.text
    assert "resuming from" in caplog.text and "previous.pth" in caplog.text
    assert s["steps"] == 4 and s["stopped"] is None


def test_fallback_is_not_overwritten_by_the_unreadable_checkpoint(interrupted, tmp_path):
    """After a resume from previous.pth, the next save must not rotate the torn last.pth over it."""
    _, src, common = interrupted
    out = _copy_run(src, tmp_path / "run")
    data = (out / "last.pth").read_bytes()
    (out / "last.pth").write_bytes(data[: len(data) // 2])
    s = _resume(out, common, **{"data.workers": 0, "train.max_steps": 0})
    assert s["steps"] == 4
    assert ckpt_io.load(out / "previous.pth")["step"] == 2  # the fallback, still readable
    assert ckpt_io.load(out / "last.pth")["step"] == 4
    assert (out / "last.pth.unreadable").read_bytes() == data[: len(data) // 2]  # kept aside, not deleted


def test_a_second_run_on_the_same_output_is_refused(interrupted, tmp_path):
    from inline_attn.runtime.output import OutputLock

    _, src, common = interrupted
    out = _copy_run(src, tmp_path / "run")
    before = (out / "last.pth").read_bytes()
    with OutputLock(out):
        with pytest.raises(ValueError, match=f"output folder {out} is in use by another run"):
            _resume(out, common)
    assert (out / "last.pth").read_bytes() == before


def test_a_new_run_into_an_interrupted_one_is_refused_and_overwrite_moves_it_aside(interrupted, tmp_path):
    _, src, common = interrupted
    out = _copy_run(src, tmp_path / "run")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".lock"}
    with pytest.raises(ValueError, match=f"output folder {out} holds a finished or interrupted run"):
        train(Config.load(None, base_overrides(out, **common)))
    assert {n: (out / n).read_bytes() for n in before} == before
    s = train(Config.load(None, base_overrides(out, **common, **{"train.overwrite": True})))
    assert s["stopped"] is None and s["steps"] == 4  # a new run from step 0
    (aside,) = out.glob("replaced-*")
    assert {n: (aside / n).read_bytes() for n in before} == before  # the old run, whole


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"model.kwargs": {"depth": -1}}, "depth"),
        ({"data.mean": [0.5, 0.5]}, "different channel counts"),
        ({"data.path": "/nonexistent/imgs"}, "/nonexistent/imgs"),
    ],
    ids=["model-kwargs", "data-mean", "data-path"],
)
def test_overwrite_refused_on_the_way_leaves_the_earlier_run_in_place(interrupted, tmp_path, bad, message):
    """Every check that refuses the run comes before --overwrite moves anything: the model
    arguments, the data settings and the data used to be refused after the earlier run had moved."""
    _, src, common = interrupted
    out = _copy_run(src, tmp_path / "run")
    before = sorted(p.name for p in out.iterdir() if p.name != ".lock")
    with pytest.raises(ValueError, match=message):
        train(Config.load(None, base_overrides(out, **{**common, "train.overwrite": True, **bad})))
    assert sorted(p.name for p in out.iterdir() if p.name != ".lock") == before
    assert not list(out.glob("replaced-*"))


def test_no_readable_checkpoint_is_an_error_naming_both(interrupted, tmp_path):
    _, src, common = interrupted
    out = _copy_run(src, tmp_path / "run")
    (out / "last.pth").write_bytes(b"")
    (out / "previous.pth").write_bytes(b"\x80\x04garbage" * 10)
    with pytest.raises(ValueError, match=r"no readable checkpoint.*last.pth.*empty.*previous.pth"):
        _resume(out, common)


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "the file is empty"),
        (b"\x00\x01random bytes, not a checkpoint" * 20, "not a PyTorch or safetensors checkpoint"),
        ("half", "truncated or corrupted"),
    ],
)
def test_unreadable_checkpoint_in_eval_names_file_and_reason(interrupted, tmp_path, capsys, content, reason):
    _, src, common = interrupted
    bad = tmp_path / "bad.pth"
    if content == "half":
        data = (src / "last.pth").read_bytes()
        content = data[: len(data) // 3]
    bad.write_bytes(content)
    assert main(["eval", "--checkpoint", str(bad), "--data", common["data.path"]]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and reason in err and "Traceback" not in err


@pytest.mark.parametrize(
    "change, shown",
    [
        ({"data.batch_size": 2}, "data.batch_size: 4 -> 2"),
        ({"optim.opt": "sgd"}, "optim.opt: 'adamw' -> 'sgd'"),
        ({"model.kwargs": {"patch_size": 4, "embed_dim": 16, "depth": 2, "num_heads": 2}}, "model.kwargs: "),
        ({"sched.epochs": 3}, "sched.epochs: 2 -> 3"),
    ],
)
def test_resume_refuses_a_changed_training_setting(interrupted, change, shown):
    _, out, common = interrupted
    with pytest.raises(ValueError, match="cannot resume from checkpoint .*last.pth") as e:
        _resume(out, common, **change)
    assert shown in str(e.value) and "another --output" in str(e.value)


def _tampered(src, tmp_path, edit):
    ckpt = ckpt_io.load(src / "last.pth")
    edit(ckpt)
    path = tmp_path / "tampered.pth"
    torch.save(ckpt, path)
    return path


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c["model"].pop("head.weight"), r"model weights do not fit .*missing keys \(1\): head.weight"),
        (
            lambda c: c["model"].__setitem__("head.bias", torch.zeros(7)),
            r"wrongly-shaped keys \(file vs model\) \(1\): head.bias \[7\] vs \[3\]",
        ),
        (lambda c: [g.pop("betas") for g in c["optimizer"]["param_groups"]], "optimizer state .* does not fit AdamW"),
        (lambda c: c.__setitem__("world_size", 2), "trained on 2 processes, this run has 1"),
        (lambda c: c.__setitem__("steps_per_epoch", 5), "an epoch had 5 steps, now 2"),
    ],
)
def test_resume_refuses_a_checkpoint_that_does_not_fit(interrupted, tmp_path, edit, message):
    _, src, common = interrupted
    path = _tampered(src, tmp_path, edit)
    with pytest.raises(ValueError, match=message):
        train(Config.load(None, base_overrides(tmp_path / "run", **common, **{"train.resume": str(path)})))


def test_resume_from_a_weights_only_file_says_what_to_use(interrupted, tmp_path):
    _, src, common = interrupted
    path = tmp_path / "weights.pth"
    torch.save({"model": ckpt_io.load(src / "last.pth")["model"]}, path)
    with pytest.raises(
        ValueError, match="is not a classification checkpoint of an inline-attn run.*--model.checkpoint"
    ):
        train(Config.load(None, base_overrides(tmp_path / "run", **common, **{"train.resume": str(path)})))


def test_resume_with_more_data_is_refused(interrupted, tmp_path):
    tmp, src, common = interrupted
    out = _copy_run(src, tmp_path / "run")
    bigger = make_folder(tmp_path / "more", per_class=5)  # 15 images: 3 steps of 4
    with pytest.raises(ValueError, match="an epoch had 2 steps, now 3"):
        _resume(out, {**common, "data.path": str(bigger)})
