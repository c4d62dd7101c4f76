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
        (["reproduce", "ablations", "--quick", "--output", "{out}"], ABLATIONS),
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


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["eval", "--checkpoint", "{missing}", "--data", "fmnist", "--json", "{file}/r.json"], "--json"),
        (["seg", "eval", "--checkpoint", "{missing}", "--json", "{file}/r.json"], "--json"),
        (["seg", "eval", "--checkpoint", "{missing}", "--png", "{file}/p.png"], "--png"),
        (["det", "eval", "--checkpoint", "{missing}", "--json", "{file}/r.json"], "--json"),
        (["det", "eval", "--checkpoint", "{missing}", "--png", "{file}/p.png"], "--png"),
        (["mosaics", "--num", "2", "--png", "{file}/m.png"], "--png"),
        (["mosaics", "--num", "2", "--coco", "{file}/coco"], "--coco"),
        (["analyze", "locality", "--out", "{file}/a"], "--out"),
    ],
    ids=["eval-json", "seg-json", "seg-png", "det-json", "det-png", "mosaic-png", "coco", "analyze"],
)
def test_output_files_are_checked_before_the_work(tmp_path, capsys, argv, flag):
    # issue 36: an evaluation ran for minutes, then failed with a traceback at its --json / --png;
    # here the checkpoint does not even exist: the output is what is refused, first
    f = tmp_path / "taken"
    f.write_text("x")
    args = [a.format(file=f, missing=tmp_path / "none.pth") for a in argv]
    if args[0] == "mosaics":
        args = ["seg", *args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"inline-attn: error: {flag}") and str(f) in err and "is not a folder" in err, err
    assert "Traceback" not in err and "none.pth" not in err


def test_writable_file_refuses_a_folder_and_creates_the_parent(tmp_path):
    from inline_attn._io import writable_file

    target = str(tmp_path / "new" / "r.json")
    assert writable_file(target, "--json") is target and (tmp_path / "new").is_dir()
    with pytest.raises(ValueError, match=rf"--json {tmp_path} is a folder: expected a file path"):
        writable_file(tmp_path, "--json")


def test_corrupt_json_names_the_file(tmp_path):
    from inline_attn._io import read_json
    from inline_attn.dense.data.coco import read_instances
    from inline_attn.experiments.ablations import run_ablations

    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [1, 2')
    with pytest.raises(ValueError, match=rf"{bad}: not valid JSON \(Expecting .* at line 1, column"):
        read_json(bad)
    with pytest.raises(ValueError, match=rf"{bad}: not valid JSON"):
        read_instances(bad)
    bad.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match=rf"{bad}: not a JSON file \(not UTF-8 text"):
        read_json(bad)
    results = tmp_path / "runs" / "results"
    results.mkdir(parents=True)
    (results / "fmnist-softmax__seed0.json").write_text("{truncated")
    with pytest.raises(ValueError, match=r"fmnist-softmax__seed0.json: not valid JSON"):
        run_ablations("quick", output=str(tmp_path / "runs"), parts="g", seeds=1, report_only=True, progress=False)
