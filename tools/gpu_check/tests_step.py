"""The ``tests`` step: the native Triton and CUDA tests through pytest, first, in its time box.

On a fresh machine most of its time is JIT compilation (the Triton kernels for every tested shape,
inductor's graphs), so the files run in pytest-xdist workers where xdist is installed, and the run
is interrupted with SIGINT at the end of the box: pytest then still prints its counts.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import signal
import subprocess
import sys

from .budget import StepContext
from .output import cap_log

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository (tests/, configs/)
TEST_FILES = (
    "tests/ops/test_triton.py",  # the default kernels against float64, first
    "tests/ops/test_triton_stream.py",
    "tests/ops/test_fused_predictor.py",
    "tests/runtime/test_graphs.py",
    "tests/ops/test_custom_ops.py",
    "tests/gpu",
    "tests/models/test_real_timm.py",  # the adoption entries against the real timm (the device has it)
)
GRACE_S = 20.0  # from SIGINT to SIGKILL, inside the box
MAX_FAILURES_LISTED = 15


def workers() -> int:
    """pytest-xdist workers: the compiles are CPU-bound (most of a cold run), the tests share one
    GPU; two cores are left to the GPU's feeding. On an H200's 16 cores, 8 workers ran 140 tests in
    130 s cold and 14 workers 216 in 160 s."""
    return max(1, (os.cpu_count() or 2) - 2)


def tests_command(files: list[str], quick: bool, xdist: bool) -> list[str]:
    """The pytest command of the step: quiet, failures and errors listed in short, no cache."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "--tb=short", "-p", "no:cacheprovider", *files]
    if xdist:
        cmd += ["-n", str(workers())]
    if quick:
        cmd += ["-x"]
    return cmd


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_interruptible(cmd: list[str], log: pathlib.Path, timeout_s: float, grace_s: float = 30.0, **kw) -> int | None:
    """Run ``cmd`` with its output streamed to ``log``; after ``timeout_s`` interrupt it with SIGINT
    (pytest then reports the tests run so far, as after Ctrl-C) and kill it if it has not exited
    ``grace_s`` later. Returns the exit status, or None when it had to be interrupted."""
    with open(log, "w") as fh:  # streamed, so a stopped run still shows how far it got
        # SIGINT back to its default in the child: a shell without job control starts background
        # jobs (`nohup make gpu-check &`) with SIGINT ignored, the child would inherit that, and
        # Python would then never turn the interrupt into KeyboardInterrupt (pytest's counts)
        proc = subprocess.Popen(
            cmd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=_default_sigint,
            **kw,
        )
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        try:  # the whole group: pytest-xdist's workers too
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:  # it ended between the timeout and the signal
            proc.wait()
        return None


def failures(log_text: str) -> list[str]:
    """pytest's short summary lines of failed and erroring tests (``-rfE``), the first few."""
    found = [line for line in log_text.splitlines() if re.match(r"^(FAILED|ERROR) ", line)]
    return found[:MAX_FAILURES_LISTED]


def run(ctx: StepContext) -> dict:
    """Run :data:`TEST_FILES` (those present) within the box -> ok, summary (pytest's last line),
    the failures listed, the files not found."""
    files = [f for f in TEST_FILES if (ROOT / f).exists()]
    missing = [f for f in TEST_FILES if f not in files]
    cmd = tests_command(files, ctx.quick, xdist=importlib.util.find_spec("xdist") is not None)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("TRITON_INTERPRET", None)
    log = ctx.out / "tests.log"
    timeout_s = max(ctx.seconds_left() - GRACE_S, 1.0)
    code = run_interruptible(cmd, log, timeout_s, grace_s=GRACE_S, cwd=ROOT, env=env)
    cap_log(log)
    text = log.read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    last = (lines[-1:] or ["(no output)"])[0]
    summary = last if code is not None else f"interrupted after {timeout_s:.0f} s: {last}"
    if missing:
        summary += f" (not found, not run: {', '.join(missing)})"
    return {"ok": code == 0, "summary": summary + " (tests.log)", "returncode": code, "failures": failures(text)}
