"""``python -m inline_attn.cli.torchrun ...``: torchrun, ending quietly when a signal stops the run.

It takes torchrun's arguments unchanged (``python -m inline_attn.cli.torchrun --nproc_per_node=8 -m
inline_attn.cli train -c ...``). When the launcher or its workers get SIGINT/SIGTERM/SIGHUP, the workers
of ``inline-attn train`` save a checkpoint and exit with 128 + the signal's number; plain
torchrun then prints a traceback (its own SignalException, or a ChildFailedError for the
workers' exit codes). This launcher prints one line instead and exits with the same code. Any
other failure keeps torchrun's full report.
"""

from __future__ import annotations

import signal
import sys
from typing import Optional, Sequence

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stopped_by_signal(exitcodes: Sequence[int]) -> Optional[int]:
    """The signal every worker was stopped by (exit code 128 + N, or -N when killed by it), else None."""
    sigs = {abs(c) if c < 0 else c - 128 for c in exitcodes}
    if len(sigs) == 1 and next(iter(sigs)) in [int(s) for s in _STOP_SIGNALS]:
        return next(iter(sigs))
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(list(argv) if argv is not None else None)
    except SignalException as e:
        signum = int(e.sigval)
        print(
            f"inline-attn torchrun: stopped by {signal.Signals(signum).name}; the workers saved their checkpoint "
            "(continue with the same command and --resume auto)",
            file=sys.stderr,
        )
        return 128 + signum
    except ChildFailedError as e:
        signum = _stopped_by_signal([f.exitcode for f in e.failures.values()])
        if signum is None:
            raise
        print(
            f"inline-attn torchrun: the workers stopped on {signal.Signals(signum).name} and saved their "
            "checkpoint (continue with the same command and --resume auto)",
            file=sys.stderr,
        )
        return 128 + signum
    return 0


if __name__ == "__main__":
    sys.exit(main())
