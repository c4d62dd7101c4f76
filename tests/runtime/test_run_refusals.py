"""The run machinery loses and hides nothing: a run resumed from another folder's checkpoint into a
finished run's folder is refused like a new run, a run file that is a folder is refused, one setting
given two values on the command line is refused, SIGHUP stops a run as SIGTERM does, and a run
folder is read for its own checkpoint, never one an ``--overwrite`` moved aside."""

from __future__ import annotations

import os
import pathlib
import signal

import pytest
import torch

from inline_attn.cli import main
from inline_attn.runtime.output import claim_output
from inline_attn.runtime.signals import StopFlag
from inline_attn.train.evaluate import run_checkpoint

RUN = {"last.pth": b"weights", "previous.pth": b"older", "summary.json": b"{}"}
CONFIGS = pathlib.Path(__file__).parents[2] / "configs"


def _finished(folder: pathlib.Path) -> pathlib.Path:
    folder.mkdir(parents=True)
    for name, data in RUN.items():
        (folder / name).write_bytes(data)
    return folder


def test_resuming_another_folder_s_checkpoint_into_a_finished_run_is_refused_like_a_new_run(tmp_path):
    out = _finished(tmp_path / "finished")
    other = _finished(tmp_path / "other") / "last.pth"
    with pytest.raises(ValueError, match=rf"output folder {out} holds a finished or interrupted run"):
        with claim_output(out, resume=str(other)):
            pass
    assert {n: (out / n).read_bytes() for n in RUN} == RUN
    with claim_output(out, resume=str(other), overwrite=True):  # replacing it is allowed, moving it aside
        assert not (out / "last.pth").exists()
    (moved,) = [p for p in out.iterdir() if p.name.startswith("replaced-")]
    assert (moved / "last.pth").read_bytes() == RUN["last.pth"]


@pytest.mark.parametrize("resume", ["auto", "{out}/last.pth", "{out}/previous.pth"])
def test_resuming_the_folder_s_own_run_continues_it(tmp_path, resume):
    out = _finished(tmp_path / "run")
    with claim_output(out, resume=resume.format(out=out)):
        pass
    assert {n: (out / n).read_bytes() for n in RUN} == RUN
    with pytest.raises(ValueError, match=r"continues the run in .* and overwrite replaces it"):
        with claim_output(out, resume=resume.format(out=out), overwrite=True):
            pass


@pytest.mark.parametrize("resume", [None, "auto"])
@pytest.mark.parametrize("name", ["last.pth", "previous.pth", "summary.json"])
def test_a_run_file_that_is_a_folder_is_refused_naming_it(tmp_path, name, resume):
    out = tmp_path / "run"
    (out / name).mkdir(parents=True)
    with pytest.raises(ValueError, match=rf"output folder {out} holds {name} as a folder where the run keeps a file"):
        with claim_output(out, resume=resume):
            pass
    assert (out / name).is_dir()


@pytest.mark.parametrize(
    "flags, key",
    [
        (["--output", "{a}", "--train.output", "{b}"], "train.output"),
        (["--output", "{a}", "--set", "train.output={b}"], "train.output"),
        (["--train.output", "{a}", "--set", "train.output={b}"], "train.output"),
        (["--resume", "auto", "--train.resume", "{b}/last.pth"], "train.resume"),
        (["--set", "optim.lr=0.1", "--optim.lr", "0.2"], "optim.lr"),
    ],
)
def test_one_setting_given_two_values_is_refused(tmp_path, capsys, flags, key):
    argv = ["train", "--data.path", str(tmp_path / "no-data")] + [
        f.format(a=tmp_path / "A", b=tmp_path / "B") for f in flags
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{key} is given two values" in err and "give it once" in err, err
    assert not (tmp_path / "A").exists() and not (tmp_path / "B").exists()


def test_the_same_value_twice_is_not_a_conflict(tmp_path, capsys):
    argv = ["train", "--data.path", str(tmp_path / "no-data"), "--output", str(tmp_path / "A")]
    assert main(argv + ["--train.output", str(tmp_path / "A")]) == 2  # stops at the missing data, not before
    assert "no-data" in capsys.readouterr().err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_sighup_asks_the_run_to_stop_as_sigterm_does(signum):
    before = signal.getsignal(signum)
    with StopFlag() as flag:
        os.kill(os.getpid(), signum)
        assert flag.requested() and flag.signum == signum
    assert signal.getsignal(signum) is before


def test_a_run_folder_is_read_for_its_own_checkpoint_never_a_replaced_one(tmp_path):
    run = tmp_path / "run"
    (run / "replaced-20261127-000000").mkdir(parents=True)
    torch.save({}, run / "replaced-20261127-000000" / "best.pth")
    with pytest.raises(ValueError, match=r"holds no checkpoint .*moved into replaced-20261127-000000: name one"):
        run_checkpoint(run)
    torch.save({}, run / "last.pth")
    assert run_checkpoint(run) == run / "last.pth"  # not the replaced run's best.pth
    assert run_checkpoint(run / "replaced-20261127-000000") == run / "replaced-20261127-000000" / "best.pth"
