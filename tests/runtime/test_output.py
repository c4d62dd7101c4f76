"""The overwrite rule of every run's output folder (:func:`inline_attn.runtime.output.claim_output`)."""

from __future__ import annotations

import pytest

from inline_attn.runtime.output import claim_output


def _finished_run(folder):
    folder.mkdir(parents=True)
    for name in ("last.pth", "previous.pth", "summary.json", "metrics.csv", "config.yaml"):
        (folder / name).write_text(name)
    (folder / "tb").mkdir()
    (folder / "tb" / "events").write_text("events")
    return folder


def test_a_folder_holding_a_run_is_refused_naming_it_and_the_two_choices(tmp_path):
    out = _finished_run(tmp_path / "run")
    with pytest.raises(ValueError) as e:
        with claim_output(out):
            pytest.fail("the run must not start")
    msg = str(e.value)
    assert f"output folder {out} holds a finished or interrupted run (last.pth, previous.pth, summary.json)" in msg
    assert "--resume auto" in msg and "another --output" in msg
    assert (out / "last.pth").read_text() == "last.pth" and not list(out.glob("replaced-*"))


@pytest.mark.parametrize("contents", [None, [], ["config.yaml", "metrics.csv"]], ids=["no-folder", "empty", "no-ckpt"])
def test_a_folder_without_a_checkpoint_or_summary_is_free(tmp_path, contents):
    out = tmp_path / "run"
    if contents is not None:
        out.mkdir()
        for name in contents:
            (out / name).write_text(name)
    with claim_output(out) as held:
        assert held == out and out.is_dir()


def test_resume_continues_in_the_folder(tmp_path):
    out = _finished_run(tmp_path / "run")
    with claim_output(out, resume="auto"):
        assert (out / "last.pth").read_text() == "last.pth"


def test_overwrite_moves_the_run_aside_and_never_deletes(tmp_path):
    out = _finished_run(tmp_path / "run")
    with claim_output(out, overwrite=True):
        (aside,) = out.glob("replaced-*")
        assert sorted(p.name for p in out.iterdir()) == [".lock", aside.name]
        assert (aside / "last.pth").read_text() == "last.pth" and (aside / "tb" / "events").read_text() == "events"
        (out / "last.pth").write_text("new")
    with claim_output(out, overwrite=True):  # a second replacement keeps the first one where it is
        assert len(list(out.glob("replaced-*"))) == 2
    assert (aside / "summary.json").read_text() == "summary.json"


def test_only_the_writing_process_moves_files(tmp_path):
    out = _finished_run(tmp_path / "run")
    with claim_output(out, overwrite=True, lock=False):
        assert (out / "last.pth").is_file() and not list(out.glob("replaced-*"))


def test_resume_with_overwrite_is_refused(tmp_path):
    with pytest.raises(ValueError, match="resume='auto' continues the run .* overwrite replaces it: choose one"):
        with claim_output(tmp_path / "run", resume="auto", overwrite=True):
            pass


def test_a_second_demo_writes_beside_the_first(tmp_path, capsys):
    from inline_attn.runtime.output import demo_output

    default = str(tmp_path / "seg_demo")
    assert demo_output(None, default) == default  # nothing there yet
    (tmp_path / "seg_demo").mkdir()
    (tmp_path / "seg_demo" / "summary.json").write_text("{}")
    assert demo_output(None, default) == default + "-2"
    assert "seg_demo-2" in capsys.readouterr().err
    (tmp_path / "seg_demo-2").mkdir()
    (tmp_path / "seg_demo-2" / "last.pth").write_bytes(b"")
    assert demo_output(None, default) == default + "-3"
    assert demo_output(None, default, continuing="auto") == default  # --resume / --overwrite act on the first
    assert demo_output("mine", default) == "mine"
    assert (tmp_path / "seg_demo" / "summary.json").read_text() == "{}"  # the earlier run is untouched
