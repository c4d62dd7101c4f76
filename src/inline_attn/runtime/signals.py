"""Stopping a run on a signal: SIGINT / SIGTERM / SIGHUP (a closed terminal) ask the loop to checkpoint at the next step
boundary (:class:`StopFlag`), every process stops at the same step (:func:`stop_everywhere`), and
the command exits with 128 + signum (:func:`exit_code`)."""

from __future__ import annotations

import signal
from typing import Optional

import torch
import torch.distributed as dist

from .distributed import DistInfo, all_reduce

__all__ = ["StopFlag", "exit_code", "stop_everywhere"]


class StopFlag:
    """Set by SIGINT, SIGTERM or SIGHUP (the terminal closed, handled as SIGTERM): the loop saves a
    checkpoint at the next step boundary and returns.

    Use as a context manager (or :meth:`install` / :meth:`restore`); outside the main thread no
    handler is installed. A second Ctrl-C stops at once (KeyboardInterrupt).
    """

    def __init__(self):
        self.signum: Optional[int] = None
        self._old = {}

    def install(self) -> None:
        if not hasattr(signal, "SIGTERM"):
            return
        try:
            for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
                if s is not None:
                    self._old[s] = signal.signal(s, self._handle)
        except ValueError:  # not the main thread: no handlers
            self._old = {}

    def _handle(self, signum, frame):
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.signum = signum

    def requested(self) -> bool:
        return self.signum is not None

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}

    def __enter__(self) -> "StopFlag":
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def stop_everywhere(requested: bool, info: DistInfo) -> bool:
    """True on every process when any asks to stop (torchrun signals each worker separately)."""
    flag = torch.tensor([1.0 if requested else 0.0])
    return all_reduce(flag, info, dist.ReduceOp.MAX).item() > 0


def exit_code(signum: Optional[int]) -> int:
    """The shell's code for a run stopped by signal ``signum`` (128 + signum), 0 otherwise."""
    return 128 + int(signum) if signum else 0
