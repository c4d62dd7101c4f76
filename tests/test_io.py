"""Atomic writes: a writer killed midway leaves the previous file intact, and its temp file goes.
The file lock and the PID check shared by the kernel build and the output folder."""

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from inline_attn._io import FileLock, LockHeld, atomic_path, atomic_write_text, pid_alive, remove_stale_temps


def test_writer_killed_midway_keeps_previous_file_and_next_write_removes_its_temp(tmp_path):
    path = tmp_path / "last.pth"
    with atomic_path(path) as tmp:
        torch.save({"step": 1, "w": torch.arange(5.0)}, tmp)
    child = textwrap.dedent(f"""
        import os, time, torch
        from inline_attn import _io
        def slow_fsync(fd):            # the new bytes are written; the rename has not happened
            open({str(tmp_path / "ready")!r}, 'w').close()
            time.sleep(60)
        _io.os.fsync = slow_fsync
        with _io.atomic_path({str(path)!r}) as tmp:
            torch.save({{"step": 2, "w": torch.zeros(1_000_000)}}, tmp)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child])
    try:
        t0 = time.time()
        while not (tmp_path / "ready").exists():
            assert proc.poll() is None and time.time() - t0 < 60, "child died before writing"
            time.sleep(0.05)
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    torn = [p for p in tmp_path.iterdir() if p.name.startswith(".last.pth.tmp")]
    assert len(torn) == 1 and torn[0].stat().st_size > 4_000_000  # the killed writer's bytes
    state = torch.load(path)
    assert state["step"] == 1 and torch.equal(state["w"], torch.arange(5.0))
    with atomic_path(path) as tmp:  # the next write of the same file removes the dead writer's temp
        torch.save({"step": 3}, tmp)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".last")] == []
    assert torch.load(path)["step"] == 3


def test_failed_write_leaves_target_and_no_temp(tmp_path):
    path = atomic_write_text(tmp_path / "a.json", "old")
    try:
        with atomic_path(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("writer failed")
    except RuntimeError:
        pass
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_live_writers_temps_are_kept(tmp_path):
    import os

    mine = tmp_path / f".x.tmp{os.getppid()}"  # a live process (our parent) owns it
    mine.write_text("in progress")
    assert remove_stale_temps(tmp_path / "x") == [] and mine.exists()


def test_a_held_file_lock_is_refused_naming_its_holder_and_freed_on_exit(tmp_path):
    path = tmp_path / "x.lock"
    with FileLock(path) as held:
        assert held.locked and path.read_text() == str(os.getpid())
        notices = []
        with pytest.raises(LockHeld, match=rf"x\.lock is locked by process {os.getpid()}") as refused:
            with FileLock(path, wait_s=0.3, on_wait=notices.append, notice_s=0.1, poll_s=0.05):
                pass
        assert refused.value.holder == str(os.getpid()) and 0.3 <= refused.value.waited < 5
        assert len(notices) == 1  # one notice however long the wait
    assert path.read_text() == ""  # the holder's PID goes with the lock
    with FileLock(path) as again:
        assert again.locked


def test_pid_alive_tells_a_running_process_from_a_finished_one():
    assert pid_alive(os.getpid())
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert not pid_alive(done.pid)
