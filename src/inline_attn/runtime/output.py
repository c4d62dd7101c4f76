"""The output folder of a run: one run at a time, and a finished or interrupted run is never
replaced by accident.

:func:`claim_output` is the one rule every task (``train``, ``seg train``, ``det train``) and the
ablation runner (``reproduce ablations``) follow. A new run into a folder that holds a run (its
checkpoints or its summary) stops before any work, naming the folder and the two ways on:
``--resume auto`` continues that run, another ``--output`` starts a new one beside it. An
explicit overwrite (``--overwrite``, ``train.overwrite: true``) replaces the run: its files move
into a ``replaced-<UTC time>`` subfolder, never deleted. A training run holds the folder with
:func:`hold_output` and moves the earlier run only once its own checks have passed.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
import time
from typing import Callable, Iterator, Optional, Sequence

from .._io import FileLock, LockHeld

# what a training run leaves once it has saved a checkpoint or finished
RUN_FILES = ("last.pth", "previous.pth", "summary.json")
REPLACED_PREFIX = "replaced-"
OVERWRITE_HELP = "replace a finished or interrupted run in the output folder (its files move into a subfolder)"
LOCK_NAME = ".lock"


class OutputLock:
    """An exclusive lock on ``folder/.lock`` for the life of a run (rank 0 only).

    Two runs writing one output folder would interleave their checkpoints and metrics; the
    second is refused with a ValueError naming the folder and the process holding it. The lock
    is a :class:`~inline_attn._io.FileLock`: the kernel drops it when the holder dies, so a
    killed run never leaves a stale lock behind.
    """

    def __init__(self, folder: pathlib.Path, enabled: bool = True):
        self.folder, self.enabled = pathlib.Path(folder), enabled
        self._lock: Optional[FileLock] = None

    def __enter__(self) -> "OutputLock":
        if not self.enabled:
            return self
        lock = FileLock(self.folder / LOCK_NAME)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            lock.__enter__()
        except LockHeld as e:
            raise ValueError(
                f"output folder {self.folder} is in use by another run (process {e.holder}, lock {e.path}): "
                "wait for it to finish, stop it, or choose another --output"
            ) from None
        except OSError as e:  # a read-only place, or a file where a folder should be
            raise ValueError(
                f"cannot write the run's outputs into {self.folder} ({type(e).__name__}: {e.strerror or e}): "
                "choose a writable --output folder"
            ) from None
        self._lock = lock
        return self

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            self._lock.__exit__(*exc)
            self._lock = None


def _found(folder: pathlib.Path, patterns: Sequence[str]) -> list[str]:
    """The files in ``folder`` matching ``patterns`` (globs relative to it), as relative paths."""
    if not folder.is_dir():
        return []
    return sorted({str(p.relative_to(folder)) for pattern in patterns for p in folder.glob(pattern)})


def _inside(path: pathlib.Path, folder: pathlib.Path) -> bool:
    """Whether the file ``path`` lies directly in ``folder`` (a checkpoint of the run kept there)."""
    return path.resolve().parent == folder.resolve()


def _move_aside(folder: pathlib.Path) -> pathlib.Path:
    """Move every entry of ``folder`` (but the lock and runs replaced before) into a new
    ``replaced-<UTC time>`` subfolder; returns it."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    target, n = folder / f"{REPLACED_PREFIX}{stamp}", 1
    while target.exists():  # two replacements within a second
        target, n = folder / f"{REPLACED_PREFIX}{stamp}-{n}", n + 1
    target.mkdir()
    for entry in sorted(folder.iterdir()):
        if entry.name != LOCK_NAME and not entry.name.startswith(REPLACED_PREFIX):
            os.replace(entry, target / entry.name)
    return target


@contextlib.contextmanager
def claim_output(
    folder,
    *,
    resume: Optional[str] = None,
    overwrite: bool = False,
    lock: bool = True,
    run_files: Sequence[str] = RUN_FILES,
) -> Iterator[pathlib.Path]:
    """Hold ``folder`` for one run: the output lock (:class:`OutputLock`,
    when ``lock``), then the overwrite rule; yields the folder.

    ``run_files``: globs (relative to ``folder``) whose matches show that a run is there. With
    ``resume="auto"`` or a checkpoint of ``folder`` the run continues (or starts) there; otherwise
    (a new run, or one resumed from another folder's checkpoint) a folder holding a run raises
    ValueError naming it and the two choices, unless ``overwrite``, which moves the run's files
    aside first (only where ``lock``: the process that writes; the others only check, so every
    process of a distributed run stops alike). Continuing the folder's run with ``overwrite`` is a
    ValueError; so is a run file that is a folder (``last.pth/``), which no checkpoint can replace.
    """
    with hold_output(folder, resume=resume, overwrite=overwrite, lock=lock, run_files=run_files) as replace_earlier:
        replace_earlier()
        yield pathlib.Path(folder)


@contextlib.contextmanager
def hold_output(
    folder,
    *,
    resume: Optional[str] = None,
    overwrite: bool = False,
    lock: bool = True,
    run_files: Sequence[str] = RUN_FILES,
) -> Iterator[Callable[[], None]]:
    """:func:`claim_output`'s lock and refusals, with the overwrite's move left to the caller: yields
    ``replace_earlier()``, which moves an earlier run aside (with ``overwrite``, where ``lock``; once).
    A training run calls it after its own checks (the data read, the model built, the checkpoint
    fitted), before it writes: a run refused on the way leaves the earlier one where it was."""
    folder = pathlib.Path(folder)
    continues = bool(resume) and (resume == "auto" or _inside(pathlib.Path(resume), folder))
    if continues and overwrite:
        raise ValueError(
            f"resume={resume!r} continues the run in {folder} and overwrite replaces it: choose one "
            "(--resume or --overwrite / train.overwrite)"
        )
    with OutputLock(folder, enabled=lock):
        not_files = [name for name in _found(folder, run_files) if not (folder / name).is_file()]
        if not_files:
            raise ValueError(
                f"output folder {folder} holds {', '.join(not_files)} as a folder where the run keeps a file: "
                "move it away, or choose another --output"
            )
        found = [] if continues else _found(folder, run_files)
        if found and not overwrite:
            shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
            raise ValueError(
                f"output folder {folder} holds a finished or interrupted run ({shown}): continue it with "
                "--resume auto, or choose another --output (--overwrite replaces it, moving its files "
                "into a subfolder)"
            )

        def replace_earlier() -> None:
            if found and lock:
                moved = _move_aside(folder)
                print(f"--overwrite: the earlier run in {folder} moved into {moved}", file=sys.stderr, flush=True)
                found.clear()

        yield replace_earlier


def demo_output(given: Optional[str], default: str, *, continuing=False) -> str:
    """The output folder of a demo: ``given`` when one is named; else ``default`` if it holds no run
    (or the demo continues or replaces the run there: ``continuing``), else the first of
    ``default-2``, ``default-3``, ... that holds none, said on stderr. A second ``make demo`` so runs
    beside the first, which stays as it was."""
    if given is not None:
        return given
    folder, n = pathlib.Path(default), 1
    if continuing:
        return default
    while _found(folder, RUN_FILES):
        n += 1
        folder = pathlib.Path(f"{default}-{n}")
    if n > 1:
        print(
            f"{default} holds an earlier run: this one writes to {folder} (--output chooses the folder, "
            "--resume auto continues the earlier run, --overwrite replaces it)",
            file=sys.stderr,
            flush=True,
        )
    return str(folder)
