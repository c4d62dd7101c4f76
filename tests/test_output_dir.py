"""Output folders that cannot be written give a clear error naming the path, not a raw
traceback at the first write: a file where the folder should be, a file among its parents, no
permission (the dense and bench CLIs check before any work)."""

from __future__ import annotations

import errno
import pathlib

import pytest

from inline_attn._io import writable_dir
from inline_attn.cli import main


def test_writable_dir_creates_the_folder_and_returns_the_path_unchanged(tmp_path):
    target = str(tmp_path / "a" / "b")
    assert writable_dir(target) is target
    assert pathlib.Path(target).is_dir() and not list(pathlib.Path(target).iterdir())  # the probe is gone


def test_a_file_as_the_folder_or_among_its_parents_is_named(tmp_path):
    f = tmp_path / "results.txt"
    f.write_text("x")
    with pytest.raises(ValueError, match=rf"--output {f} is not a folder \(choose"):
        writable_dir(f, "--output")
    with pytest.raises(ValueError, match=rf"--output {f / 'run'} is not a folder: {f} is a file"):
        writable_dir(f / "run", "--output")


def test_an_unwritable_folder_is_named(tmp_path, monkeypatch):
    """The write itself fails (read-only filesystem or no permission; chmod alone would not stop
    root, who runs these tests in CI)."""

    def refuse(self, data):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(pathlib.Path, "write_bytes", refuse)
    with pytest.raises(ValueError, match=rf"--out {tmp_path} cannot be written \(Read-only file system\)"):
        writable_dir(tmp_path, "--out")


@pytest.mark.parametrize(
    "argv",
    [
        ["seg", "train", "-c", "{configs}/mosaic/demo.yaml", "--output", "{file}"],
        ["det", "train", "--output", "{file}/run"],
        ["seg", "demo", "--output", "{file}"],
        ["det", "compare", "--output", "{file}"],
        ["bench", "residual", "--out", "{file}"],
    ],
    ids=["seg-train", "det-train", "seg-demo", "det-compare", "bench"],
)
def test_cli_output_that_is_a_file_is_one_clear_line(tmp_path, capsys, argv):
    f = tmp_path / "taken"
    f.write_text("x")
    configs = pathlib.Path(__file__).parents[1] / "configs"
    assert main([a.format(file=f, configs=configs) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inline-attn: error: --out") and str(f) in err and "Traceback" not in err, err


RUN = {"last.pth": b"weights", "previous.pth": b"older", "summary.json": b"{}", "metrics.csv": b"epoch\n0\n"}
ABLATIONS = {"results/inline__seed0.json": b"{}", "invocations.json": b"{}"}


@pytest.mark.parametrize(
    "argv, files",
    [
        (["train", "--data.path", "{out}/no-data", "--output", "{out}"], RUN),
        (["seg", "train", "-c", "{configs}/mosaic/demo.yaml", "--output", "{out}"], RUN),
        (["det", "train", "-c", "{configs}/mosaic/det_demo.yaml", "--output", "{out}"], RUN),
        (["reproduce", "ablations", "--quick", "--doc", "", "--output", "{out}"], ABLATIONS),
    ],
    ids=["train", "seg-train", "det-train", "reproduce-ablations"],
)
def test_a_new_run_into_a_finished_run_stops_before_any_work(tmp_path, capsys, argv, files):
    """Issue 36: a new run (no --resume) into the --output of a finished run used to replace its
    checkpoints and metrics; now it stops first, naming the folder and the two ways on, and
    leaves every file as it was."""
    out = tmp_path / "finished"
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    configs = pathlib.Path(__file__).parents[1] / "configs"
    assert main([a.format(out=out, configs=configs) for a in argv]) == 2
    err = capsys.readouterr().err
    assert f"inline-attn: error: output folder {out} holds a finished or interrupted run" in err, err
    assert "continue it with --resume auto, or choose another --output" in err
    assert {name: (out / name).read_bytes() for name in files} == files
    assert sorted(p.name for p in out.iterdir() if p.name != ".lock") == sorted({n.split("/")[0] for n in files})
