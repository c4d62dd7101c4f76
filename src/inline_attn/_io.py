"""Atomic file writes: the one writer behind every checkpoint, config, metrics file and plot.

A file is written to a temporary sibling (``.<name>.tmp<pid>``), flushed to disk, renamed over
the target (``os.replace`` is atomic on POSIX) and the folder is synced, so a reader, or a run
resumed after a crash, sees the previous complete file or the new complete file, never a torn
one. Temporary files left by killed writers are removed by the next write of the same target. A
write that fails (a full or read-only disk) is one :class:`WriteFailed` naming the path and the
cause, the previous file intact.

:func:`writable_dir` and :func:`writable_file` check an output folder or file before a command
spends time on work it could not save: a clear ValueError naming the path instead of a raw
traceback at the first write. :func:`read_json` reads a JSON file, naming it when it is corrupt.

:func:`read_checkpoint` reads a checkpoint file (torch or safetensors), naming the file and why
when it cannot (empty, truncated, foreign, refused by ``weights_only``).

:class:`FileLock` is the one inter-process lock (the CPU kernel build, a run's output folder) and
:func:`pid_alive` the one check that a process still runs (stale temporary files and build folders).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import pathlib
import pickle
import re
import time
from typing import Any, Callable, Iterator, Optional, TypeVar, Union

try:
    import fcntl
except ImportError:  # no flock on this platform: locks are no-ops (the atomic renames stay safe)
    fcntl = None

PathLike = Union[str, os.PathLike]

__all__ = [
    "FileLock",
    "LockHeld",
    "WriteFailed",
    "atomic_path",
    "atomic_write_text",
    "pid_alive",
    "read_checkpoint",
    "read_json",
    "remove_stale_temps",
    "save_figure",
    "writable_dir",
    "writable_file",
]

log = logging.getLogger(__name__)

P = TypeVar("P", str, os.PathLike)


def _temp_name(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (one owned by another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def remove_stale_temps(path: PathLike) -> list[pathlib.Path]:
    """Delete ``.<name>.tmp<pid>`` siblings of ``path`` whose writer process is gone; returns them."""
    path = pathlib.Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.tmp(\d+)$")
    removed = []
    if not path.parent.is_dir():
        return removed
    for p in path.parent.iterdir():
        m = pattern.match(p.name)
        if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
    return removed


def _fsync_dir(folder: pathlib.Path) -> None:
    if not hasattr(os, "O_DIRECTORY"):
        return
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class WriteFailed(OSError):
    """A file could not be written (a full or read-only disk, no permission, a folder in the
    way): the message names the path and the cause, and says the previous file is kept."""

    def __init__(self, path: pathlib.Path, errno_: Optional[int], cause: str):
        super().__init__(errno_, f"cannot write {path}: {cause}; the previous file, if any, is unchanged")
        self.path = path

    def __str__(self) -> str:
        return self.strerror


# what writers that wrap the OS error say when a write fails (torch.save's zip writer, safetensors)
_WRITE_FAILURE = re.compile(r"enforce fail|file write failed|I/O error|os error \d+|unexpected pos", re.I)


def _write_failure(e: BaseException, folder: pathlib.Path) -> Optional[tuple[Optional[int], str]]:
    """``(errno, cause in words)`` when ``e`` is a failed write into ``folder``, else None (the
    writer's own error, raised as it is). torch.save reports a full disk as an ``enforce fail``
    without the OS error: the cause is then read from the folder's filesystem."""
    if isinstance(e, OSError) and e.errno is not None:
        return e.errno, os.strerror(e.errno)
    if isinstance(e, OSError) or not _WRITE_FAILURE.search(str(e)):
        return None
    found = re.search(r"os error (\d+)", str(e))
    if found:
        return int(found.group(1)), os.strerror(int(found.group(1)))
    with contextlib.suppress(OSError):
        st = os.statvfs(folder)
        if st.f_flag & os.ST_RDONLY:
            return errno.EROFS, os.strerror(errno.EROFS)
        if st.f_bavail * st.f_frsize < 1 << 20:
            return errno.ENOSPC, os.strerror(errno.ENOSPC)
    return None, str(e).splitlines()[0]


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[pathlib.Path]:
    """Yield a temporary path to write; on a clean exit it replaces ``path`` atomically.

    ``with atomic_path("run/last.pth") as tmp: torch.save(state, tmp)``. On an exception the
    temporary file is removed and ``path`` is untouched; a failed write (a full or read-only disk,
    no permission, a folder named ``path``) is a :class:`WriteFailed` naming the path and the
    cause. Writers that pick a format from the file name (matplotlib) must be told the format
    explicitly.
    """
    path = pathlib.Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WriteFailed(path, e.errno, f"its folder cannot be created ({e.strerror or e})") from None
    if path.is_dir():
        raise WriteFailed(path, errno.EISDIR, "a folder has that name")
    remove_stale_temps(path)
    tmp = _temp_name(path)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:
        failure = _write_failure(e, path.parent)
        if failure is None:
            raise
        raise WriteFailed(path, *failure) from e
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def atomic_write_text(path: PathLike, write: Union[str, Callable]) -> pathlib.Path:
    """Write text atomically: ``write`` is the text, or ``write(f)`` writes to the open file."""
    path = pathlib.Path(path)
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="") as f:
            if callable(write):
                write(f)
            else:
                f.write(write)
    return path


def save_figure(fig, path: PathLike, **savefig_kwargs) -> pathlib.Path:
    """``fig.savefig`` atomically (the format from the file's suffix: ``.png``, ``.pdf``, ``.svg``)."""
    path = pathlib.Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".").lower() or None, **savefig_kwargs)
    return path


def writable_dir(path: P, what: str = "output folder") -> P:
    """Create the folder ``path`` (and its parents) if needed and write and remove a probe file
    in it; a ValueError naming ``what`` and the path when a file stands in the way or the folder
    cannot be written (no permission, a read-only filesystem). Returns ``path`` unchanged, so a
    command can wrap its argument: ``output=writable_dir(args.output, "--output")``."""
    folder = pathlib.Path(path)
    for p in (folder, *folder.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                at = "" if p == folder else f": {p} is a file"
                raise ValueError(f"{what} {folder} is not a folder{at} (choose another path)")
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = _temp_name(folder / ".write-test")
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"{what} {folder} cannot be written ({e.strerror or e}); choose a writable folder") from None
    return path


class LockHeld(Exception):
    """:class:`FileLock` gave up: another process holds ``path`` (``holder``: the PID it wrote, or
    "unknown") after ``waited`` seconds."""

    def __init__(self, path: pathlib.Path, holder: str, waited: float):
        super().__init__(f"{path} is locked by process {holder} (waited {waited:.0f} s)")
        self.path, self.holder, self.waited = path, holder, waited


class FileLock:
    """An exclusive ``flock`` on the file ``path`` for the life of a ``with`` block; the holder
    writes its PID into the file, so a refusal can name it.

    ``wait_s``: how long to wait for another holder (0: do not wait), then :class:`LockHeld`;
    ``on_wait(waited_s)`` is called once when a wait has lasted ``notice_s``. The kernel drops an
    ``flock`` when its holder dies, so a killed process never leaves a stale lock. Opening the
    file may raise ``OSError`` (a read-only folder); where the platform or the filesystem has no
    ``flock`` the block runs unlocked (``locked`` stays False).
    """

    def __init__(
        self,
        path: PathLike,
        wait_s: float = 0.0,
        *,
        on_wait: Optional[Callable[[float], None]] = None,
        notice_s: float = 5.0,
        poll_s: float = 0.1,
    ):
        self.path, self.wait_s, self.on_wait = pathlib.Path(path), wait_s, on_wait
        self.notice_s, self.poll_s = notice_s, poll_s
        self.fd: Optional[int] = None
        self.locked = False

    def __enter__(self) -> "FileLock":
        if fcntl is None:
            return self
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        t0, noticed = time.monotonic(), False
        while not self._try_lock():
            waited = time.monotonic() - t0
            if waited >= self.wait_s:
                holder = os.read(self.fd, 64).decode(errors="replace").strip() or "unknown"
                self._close()
                raise LockHeld(self.path, holder, waited)
            if self.on_wait is not None and not noticed and waited >= self.notice_s:
                self.on_wait(waited)
                noticed = True
            time.sleep(self.poll_s)
        if self.locked:
            os.ftruncate(self.fd, 0)
            os.write(self.fd, str(os.getpid()).encode())
        return self

    def _try_lock(self) -> bool:
        """True once this process holds the lock, or when the filesystem has none to take."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as e:  # a filesystem without flock
            log.debug("no flock on %s (%s): going on without the lock", self.path, e)
            return True
        self.locked = True
        return True

    def _close(self) -> None:
        if self.fd is not None:
            if self.locked:
                with contextlib.suppress(OSError):
                    os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd, self.locked = None, False

    def __exit__(self, *exc) -> None:
        self._close()


def writable_file(path: P, what: str = "output file") -> P:
    """Check, before the work, that the file ``path`` can be written: it is not a folder, and its
    folder is created if needed and writable (:func:`writable_dir`); a ValueError naming ``what``
    and the path otherwise. Returns ``path`` unchanged."""
    file = pathlib.Path(path)
    if file.is_dir():
        raise ValueError(f"{what} {file} is a folder: expected a file path")
    writable_dir(file.parent, f"{what}'s folder")
    return path


def read_json(path: PathLike) -> Any:
    """The JSON value in the file ``path``; a ValueError naming the file when it is not valid JSON."""
    path = pathlib.Path(path)
    text = path.read_bytes()
    try:
        return json.loads(text.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a JSON file (not UTF-8 text: {e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None


def _is_zip(path: pathlib.Path) -> bool:
    """torch.save's format is a zip archive: such a file that fails to load is damaged."""
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def _read_failure(path: pathlib.Path, e: Exception, weights_only: bool) -> str:
    """Why ``path`` could not be read, in words a user can act on."""
    size = path.stat().st_size
    text = str(e)
    first = text.splitlines()[0] if text else ""
    refused = "weights_only" in text or "weights only" in text.lower()
    if size == 0:
        return f"cannot read checkpoint {str(path)!r}: the file is empty (0 bytes; a write was interrupted?)"
    if refused:
        why = "it stores Python objects besides tensors"
    elif _is_zip(path) or "PytorchStreamReader" in text or isinstance(e, EOFError):
        why = "the file is truncated or corrupted"
    elif isinstance(e, pickle.UnpicklingError):
        why = "the file is not a PyTorch or safetensors checkpoint"
    else:
        why = "unreadable"
    hint = " (if you trust the file, pass weights_only=False)" if weights_only and refused else ""
    return f"cannot read checkpoint {str(path)!r} ({size} bytes): {why} ({type(e).__name__}: {first}){hint}"


def read_checkpoint(source: Union[str, os.PathLike], *, weights_only: bool = True):
    """The object a checkpoint file holds (a ``.safetensors`` file or a torch pickle), on CPU.

    ``weights_only`` (torch files): refuse pickled objects other than tensors and containers, as
    torch.load does; pass False only for files you trust (training checkpoints also store RNG
    states and configs). A missing, empty, truncated or foreign file, or a folder, raises ValueError naming it.
    """
    path = pathlib.Path(source)
    if path.is_dir():
        raise ValueError(
            f"checkpoint file {str(path)!r} is a folder: give the file in it (a save_pretrained folder is "
            "read by from_pretrained)"
        )
    if not path.is_file():
        raise ValueError(f"checkpoint file {str(path)!r} does not exist")
    with open(path, "rb") as f:
        head = f.read(16)
    is_safetensors = path.suffix == ".safetensors" or (len(head) >= 9 and head[8:9] == b"{")
    import torch  # here, not at the top: the rest of this module needs no torch

    try:
        if is_safetensors:
            from safetensors.torch import load_file

            return load_file(str(path), device="cpu")
        return torch.load(path, map_location="cpu", weights_only=weights_only)
    except Exception as e:  # truncated / corrupted / foreign files: one clear error
        raise ValueError(_read_failure(path, e, weights_only)) from e
