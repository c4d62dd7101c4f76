"""Shared test fixtures and helpers."""

from __future__ import annotations

import os
import pathlib
import sys

# The tests exercise the checkout they live in, also from a git worktree whose venv's editable
# install points at another checkout: its src/ goes first on sys.path and on the PYTHONPATH that
# subprocesses (the CLI tests) inherit. In a plain checkout this changes nothing.
_SRC = str(pathlib.Path(__file__).resolve().parents[1] / "src")
sys.path.insert(0, _SRC)
os.environ["PYTHONPATH"] = os.pathsep.join([_SRC, *filter(None, [os.environ.get("PYTHONPATH")])])

import torch  # noqa: E402

# Triton's kernels run under its interpreter on machines without CUDA; the mode is fixed when
# triton is imported (torch imports it early), so it is chosen here, before anything else.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402

DATA_DIR = pathlib.Path(__file__).parent / "data"
REFERENCE_DIR = DATA_DIR / "reference"  # copied from shared/reference (golden files, state-dict layouts)


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    """Seed every test; run it on one intra-op thread.

    The tests use small tensors, for which one thread is faster than two, and a multi-threaded
    kernel on a busy 2-core machine can stall tenfold waiting for a descheduled thread.
    """
    torch.manual_seed(0)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
