"""A run stopped by SIGTERM saves, says how to continue and exits 128 + 15, without a traceback,
on one process and under the torchrun launcher."""

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from train_helpers import TINY_DEIT, make_folder


@pytest.fixture
def long_run(tmp_path):
    """A config whose run lasts minutes (so the signal lands mid-run) and its output folder."""
    root = make_folder(tmp_path / "imgs", per_class=20)
    cfg = {
        "model": {"name": "inline_deit_tiny", "kwargs": dict(TINY_DEIT), "drop_path": 0.0},
        "data": {"path": str(root), "img_size": 16, "batch_size": 2, "workers": 0},
        "aug": {"crop": "none", "auto_augment": None, "re_prob": 0.0, "mixup": 0.0, "cutmix": 0.0},
        "optim": {"lr": 1.0e-3},
        "sched": {"epochs": 100, "warmup_epochs": 0, "cooldown_epochs": 0},
        "train": {"progress": False, "tensorboard": False, "device": "cpu", "threads": 1},
    }
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, tmp_path / "run"


def _stop_when_training(cmd, out, timeout=120, delay=1.0, signum=signal.SIGTERM):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        t0 = time.time()
        while not (out / "config.yaml").exists():  # written just before the first step
            assert proc.poll() is None, proc.communicate()
            assert time.time() - t0 < timeout, "the run never started"
            time.sleep(0.1)
        time.sleep(delay)
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stdout, stderr


# delay 0: the signal lands as soon as config.yaml appears, before the first step (the handlers
# must already be in place: a loaded machine once stretched that gap past a second)
# SIGHUP (the terminal closed) is handled as SIGTERM
@pytest.mark.parametrize("delay, signum", [(0.0, signal.SIGTERM), (1.0, signal.SIGTERM), (1.0, signal.SIGHUP)])
def test_sigterm_exits_143_with_a_checkpoint_and_the_resume_hint(long_run, delay, signum):
    cfg, out = long_run
    rc, _, err = _stop_when_training(
        [sys.executable, "-m", "inline_attn.cli", "train", "-c", str(cfg), "--output", str(out)],
        out,
        delay=delay,
        signum=signum,
    )
    assert rc == 128 + signum, err
    assert "Traceback" not in err and "run the same command with --resume auto to continue" in err
    assert (out / "last.pth").is_file()


def test_sigterm_under_the_torchrun_launcher_exits_143_quietly(long_run):
    cfg, out = long_run
    rc, _, err = _stop_when_training(
        [
            sys.executable,
            "-m",
            "inline_attn.cli.torchrun",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "inline_attn.cli",
            "train",
            "-c",
            str(cfg),
            "--output",
            str(out),
        ],
        out,
    )
    assert rc == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "stopped by SIGTERM" in err and "--resume auto" in err
    assert (out / "last.pth").is_file()


def test_launcher_maps_worker_exit_codes():
    from inline_attn.cli.torchrun import _stopped_by_signal

    assert _stopped_by_signal([143, 143]) == signal.SIGTERM and _stopped_by_signal([-2]) == signal.SIGINT
    assert _stopped_by_signal([143, 1]) is None and _stopped_by_signal([1]) is None
