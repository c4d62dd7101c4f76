"""Progress bars on stderr that read well on a terminal and leave nothing in a log file.

On a terminal :func:`progress_bar` is tqdm's bar. When stderr is a file or a pipe (a log, CI) the
bar is off: tqdm redraws with carriage returns and, for bars that clear themselves, cursor-movement
escape codes, which a log would keep as noise; runs print their own log lines there.

:func:`restart_clock` measures the rate from the end of a warm-up step: the first step of a run
(kernel build, ``torch.compile``, data workers starting) can take a minute, and a rate that counts
it gives an ETA of hours at 0 / 1000.
"""

from __future__ import annotations

import sys
import time
from typing import Iterable, Optional


def bars_shown(progress: bool = True) -> bool:
    """Whether a bar asked for (``progress``) is drawn: only when stderr is a terminal."""
    return bool(progress) and sys.stderr.isatty()


def progress_bar(iterable: Optional[Iterable] = None, *, progress: bool = True, **options):
    """``tqdm(iterable, **options)`` on stderr, redrawn at most once a second, drawn only on a terminal."""
    from tqdm import tqdm

    options = {"file": sys.stderr, "mininterval": 1.0, "dynamic_ncols": True, **options}
    return tqdm(iterable, disable=not bars_shown(progress), **options)


def restart_clock(bar) -> None:
    """Rate and ETA from now on: the steps done so far (a warm-up) no longer count."""
    now = time.time()  # tqdm's clock
    bar.initial = bar.last_print_n = bar.n
    bar.start_t = bar.last_print_t = now
