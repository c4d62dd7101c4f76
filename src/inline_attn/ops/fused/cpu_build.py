"""Building and loading the fused CPU kernel: one cached shared library per install.

The library is compiled with the system C++ compiler (``$CXX``, else ``g++``) against the running
torch, without ninja or ``torch.utils.cpp_extension``. Its file name carries a cache key that
hashes everything the binary depends on: the source, torch's version and build, the compiler and
its flags, and the CPU's instruction sets (``-march=native`` code must not run on another CPU).
Two virtual environments with different torch builds therefore keep two libraries side by side.

Safety against interrupted and concurrent builds:

- a build compiles into a private temporary folder and moves the finished library into the cache
  with one atomic rename, so a reader finds a complete library or none; a build killed midway
  leaves only its temporary folder, which the next build removes;
- builders of one key take an advisory ``flock`` on ``<name>.lock``; the operating system
  releases it when its holder dies, so a killed build never blocks a later one. A process that
  waits longer than the lock timeout gives up with an error naming the lock, and the caller
  falls back to the eager path;
- a build records the library's size and sha256 in its build record ``<name>.json`` beside it
  (written atomically before the library is moved in). A library is loaded only when it matches
  its record: a truncated library would otherwise kill the process with SIGBUS inside ``dlopen``
  (exit 135, no message). One that does not match, or has no record, is rebuilt with a warning
  naming it; in a read-only cache the kernel is skipped (eager path) with a warning saying how to
  rebuild it;
- a library already in the cache that matches its record is loaded as it is: nothing is written
  and no lock is taken, so the cache may be read-only (build it ahead with
  ``inline-attn build-kernel``).

Cache folder: ``$INLINE_ATTN_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/inline_attn/kernels``, else
``~/.cache/inline_attn/kernels``. Lock timeout: ``$INLINE_ATTN_KERNEL_LOCK_TIMEOUT`` seconds
(default :data:`DEFAULT_LOCK_TIMEOUT`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import platform
import shlex
import sys
import shutil
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

import torch

from ..._io import FileLock, LockHeld, pid_alive

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "KERNEL_SOURCE",
    "KernelBuildError",
    "KernelSpec",
    "build_cpu_kernel",
    "cache_dir",
    "cpu_kernel_error",
    "kernel_spec",
    "library_mismatch",
    "load_cpu_kernel",
]

log = logging.getLogger(__name__)

KERNEL_SOURCE = Path(__file__).with_name("csrc") / "inline_cpu.cpp"
# a build takes 30-60 s on a 2-core machine; waiting several times that for another builder is
# still better than the eager path for the rest of a long process
DEFAULT_LOCK_TIMEOUT = 180.0
DEFAULT_CFLAGS = ("-O3", "-march=native", "-fopenmp")
DEFAULT_LDFLAGS = ("-fopenmp",)
COMPILE_TIMEOUT = 900.0
_WAIT_NOTICE_S = 5.0  # say what we wait for once the wait is noticeable
_POLL_S = 0.1
PathLike = Union[str, os.PathLike]

_loaded: dict[str, bool] = {}
_errors: dict[str, Optional[str]] = {"last": None}


class KernelBuildError(RuntimeError):
    """The kernel could not be built or loaded; the message says which file or lock and why."""


@dataclass(frozen=True)
class KernelSpec:
    """One build: what is compiled, how, and the cache key derived from all of it."""

    source: Path
    cxx: str
    cflags: tuple[str, ...]
    ldflags: tuple[str, ...]
    link_torch: bool
    key: str

    @property
    def name(self) -> str:
        """File stem of the library: ``<source stem>-<torch version>-<key>``."""
        version = torch.__version__.replace("+", "_")
        return f"{self.source.stem}-{version}-{self.key}"

    def library(self, folder: Optional[PathLike] = None) -> Path:
        return Path(folder or cache_dir()) / f"{self.name}.so"

    def lock(self, folder: Optional[PathLike] = None) -> Path:
        return Path(folder or cache_dir()) / f"{self.name}.lock"

    def record(self, folder: Optional[PathLike] = None) -> Path:
        """The build record beside the library: its command, size and sha256 (JSON)."""
        return Path(folder or cache_dir()) / f"{self.name}.json"

    def command(self, output: PathLike) -> list[str]:
        """The compiler command line writing the library to ``output``."""
        cmd = [self.cxx, "-shared", "-fPIC", "-std=c++20", *self.cflags]
        if self.link_torch:
            from torch.utils.cpp_extension import include_paths

            torch_lib = Path(torch.__file__).parent / "lib"
            cmd += [f"-DTORCH_EXTENSION_NAME={self.source.stem}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
            for inc in include_paths("cpu"):
                cmd += ["-isystem", inc]
            cmd += [str(self.source), "-o", str(output), f"-L{torch_lib}", "-lc10", "-ltorch_cpu", "-ltorch"]
        else:
            cmd += [str(self.source), "-o", str(output)]
        return cmd + list(self.ldflags)


def cache_dir() -> Path:
    """The folder holding built kernels (see the module docstring for the search order)."""
    env = os.environ.get("INLINE_ATTN_KERNEL_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "inline_attn" / "kernels"


def _cpu_flags() -> str:
    flags = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return flags + line
    except OSError:
        pass
    return flags + platform.processor()


def kernel_spec(
    source: PathLike = KERNEL_SOURCE,
    *,
    cxx: Optional[str] = None,
    cflags: Sequence[str] = DEFAULT_CFLAGS,
    ldflags: Sequence[str] = DEFAULT_LDFLAGS,
    link_torch: bool = True,
) -> KernelSpec:
    """The build of ``source`` for this install and CPU, and its cache key.

    ``link_torch=False`` compiles a plain C++ library (no torch headers or libraries).
    """
    source = Path(source).resolve()
    if not source.is_file():
        raise KernelBuildError(f"kernel source {source} does not exist")
    cxx = cxx or os.environ.get("CXX") or "g++"
    facts = {
        "source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", ""),
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "cxx": shutil.which(cxx) or cxx,
        "cflags": list(cflags),
        "ldflags": list(ldflags),
        "link_torch": link_torch,
        "cpu": hashlib.sha256(_cpu_flags().encode()).hexdigest(),
    }
    key = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    return KernelSpec(source, cxx, tuple(cflags), tuple(ldflags), link_torch, key)


def _lock_timeout(value: Optional[float]) -> float:
    if value is not None:
        return float(value)
    env = os.environ.get("INLINE_ATTN_KERNEL_LOCK_TIMEOUT")
    if env is None:
        return DEFAULT_LOCK_TIMEOUT
    try:
        return float(env)
    except ValueError:
        raise KernelBuildError(f"INLINE_ATTN_KERNEL_LOCK_TIMEOUT={env!r}: expected a number of seconds") from None


@contextlib.contextmanager
def _build_lock(path: Path, timeout: float) -> Iterator[None]:
    """The build lock (:class:`~inline_attn._io.FileLock`): waits up to ``timeout`` s, saying so once
    the wait is noticeable, then a :class:`KernelBuildError` naming the lock and what to do."""

    def notice(waited: float) -> None:
        log.warning(
            "inline-attn: waiting for the CPU kernel build lock %s (another process is building "
            "it; up to %.0f s, then the eager path)",
            path,
            timeout,
        )

    lock = FileLock(path, timeout, on_wait=notice, notice_s=min(_WAIT_NOTICE_S, timeout / 2), poll_s=_POLL_S)
    try:
        lock.__enter__()
    except LockHeld as e:
        raise KernelBuildError(
            f"gave up after {e.waited:.0f} s waiting for the kernel build lock {e.path}: another process "
            f"(pid {e.holder}) holds it (building the kernel, or stuck); the lock is released when that "
            "process exits. INLINE_ATTN_KERNEL_LOCK_TIMEOUT=SECONDS waits longer, INLINE_ATTN_IMPL=eager "
            "skips the kernel"
        ) from None
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


def _remove_stale_builds(folder: Path, name: str) -> None:
    """Remove temporary build folders left by killed builds of ``name`` (called under the lock)."""
    for tmp in folder.glob(f".{name}.build-*"):
        try:
            pid = int(tmp.name.rsplit("-", 2)[-2])
        except (ValueError, IndexError):
            pid = -1
        if pid == os.getpid() or (pid > 0 and pid_alive(pid)):
            continue
        shutil.rmtree(tmp, ignore_errors=True)


def _compile(spec: KernelSpec, folder: Path, verbose: bool) -> Path:
    """Compile into a private folder, then move the library into ``folder`` atomically."""
    final = spec.library(folder)
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.build-{os.getpid()}-", dir=folder))
    try:
        out = tmp / final.name
        cmd = spec.command(out)
        if verbose:
            print(" ".join(shlex.quote(c) for c in cmd), flush=True)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT)
        except FileNotFoundError:
            raise KernelBuildError(f"C++ compiler {spec.cxx!r} not found (install g++ or set CXX)") from None
        except subprocess.TimeoutExpired:
            raise KernelBuildError(f"compiling {spec.source} took over {COMPILE_TIMEOUT:.0f} s; gave up") from None
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-20:])
            raise KernelBuildError(f"compiling {spec.source} failed (exit {proc.returncode}):\n{tail}")
        with open(out, "rb") as f:
            os.fsync(f.fileno())
        manifest = {
            "source": str(spec.source),
            "key": spec.key,
            "torch": torch.__version__,
            "command": cmd,
            "build_s": round(time.monotonic() - t0, 1),
            "size": out.stat().st_size,
            "sha256": _sha256(out),
        }
        with open(tmp / "manifest.json", "w") as f:
            f.write(json.dumps(manifest, indent=2))
            f.flush()
            os.fsync(f.fileno())
        # record first, then the library: a reader between the two sees a mismatch and rebuilds
        # (under the lock, where it finds this build finished), never an unchecked library
        os.replace(tmp / "manifest.json", spec.record(folder))
        os.replace(out, final)  # atomic: readers see no library or the whole one
        log.info("built %s in %.1f s", final, manifest["build_s"])
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def library_mismatch(spec: KernelSpec, folder: Optional[PathLike] = None) -> Optional[str]:
    """Why the cached library of ``spec`` must not be loaded, or None when it matches the size and
    sha256 its build recorded. A missing library gives "missing"."""
    folder = Path(folder) if folder is not None else cache_dir()
    lib, rec = spec.library(folder), spec.record(folder)
    try:
        size = lib.stat().st_size
    except FileNotFoundError:
        return "missing"
    try:
        record = json.loads(rec.read_text())
        want_size, want_sha = int(record["size"]), str(record["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"its build record {rec} is missing, unreadable or from an older inline-attn (no size / sha256)"
    if size != want_size:
        return f"it is {size} bytes but its build recorded {want_size} (truncated or overwritten)"
    if _sha256(lib) != want_sha:
        return "its sha256 differs from the one its build recorded (overwritten or corrupted)"
    return None


def build_cpu_kernel(
    source: PathLike = KERNEL_SOURCE,
    *,
    cache: Optional[PathLike] = None,
    force: bool = False,
    verbose: bool = False,
    lock_timeout: Optional[float] = None,
    spec: Optional[KernelSpec] = None,
) -> Path:
    """Build the kernel library for this install (unless it is in the cache) and return its path.

    Args:
        source: the C++ file (the fused InLine kernel by default).
        cache: the cache folder (default :func:`cache_dir`).
        force: rebuild even when the library exists (replacing it atomically).
        verbose: print the compiler command.
        lock_timeout: seconds to wait for another process building the same key (finite, >= 0).
        spec: a :func:`kernel_spec` to build instead of the default one for ``source``.

    A library that does not match its build record (:func:`library_mismatch`) is rebuilt, with a
    warning naming it.

    Raises:
        KernelBuildError: no compiler, a compile error, a read-only cache without a good library,
            or the lock wait timed out (the message names the file or lock).
    """
    if lock_timeout is not None and (
        isinstance(lock_timeout, bool)
        or not isinstance(lock_timeout, (int, float))
        or not math.isfinite(lock_timeout)
        or lock_timeout < 0
    ):
        raise ValueError(f"lock_timeout={lock_timeout!r}: expected a finite number of seconds >= 0")
    spec = spec or kernel_spec(source)
    folder = Path(cache) if cache is not None else cache_dir()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"the kernel cache {folder} is a file: expected a folder (--cache / INLINE_ATTN_KERNEL_CACHE)")
    final = spec.library(folder)
    why = library_mismatch(spec, folder)
    if why is None and not force:
        return final
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KernelBuildError(
            f"cannot create the kernel cache {folder} ({e}); set INLINE_ATTN_KERNEL_CACHE to a writable folder"
        ) from None
    if not os.access(folder, os.W_OK):
        if why != "missing":
            raise KernelBuildError(
                f"the kernel library {final} does not match its build ({why}) and the cache {folder} is "
                "read-only; rebuild it with `inline-attn build-kernel --force` where the cache is writable, or "
                "set INLINE_ATTN_KERNEL_CACHE to a writable folder"
            )
        raise KernelBuildError(
            f"the kernel cache {folder} is read-only and holds no {final.name}; build it with "
            "`inline-attn build-kernel` where it is writable, or set INLINE_ATTN_KERNEL_CACHE"
        )
    timeout = _lock_timeout(lock_timeout)
    if verbose:
        print(f"building {final} (lock {spec.lock(folder)})", flush=True)
    else:
        # stderr, not the log: a first model call otherwise sits silent for up to a minute
        print(
            f"inline-attn: building the fused CPU kernel into {final} (g++, about 30-60 s, once per install and "
            "CPU; `inline-attn build-kernel` builds it ahead, INLINE_ATTN_IMPL=eager skips it)",
            file=sys.stderr,
            flush=True,
        )
    with _build_lock(spec.lock(folder), timeout):
        why = library_mismatch(spec, folder)
        if why is None and not force:  # another process built it while we waited
            return final
        if why != "missing" and not force:
            log.warning(
                "inline-attn: the CPU kernel library %s does not match its build (%s): rebuilding it", final, why
            )
        _remove_stale_builds(folder, spec.name)
        return _compile(spec, folder, verbose)


def load_cpu_kernel(
    source: PathLike = KERNEL_SOURCE,
    *,
    op_name: Optional[str] = None,
    cache: Optional[PathLike] = None,
    lock_timeout: Optional[float] = None,
    spec: Optional[KernelSpec] = None,
    warn: bool = True,
) -> bool:
    """Load the kernel library into this process, building it first when the cache lacks it.

    Returns True when the library is loaded (and, given ``op_name`` such as
    ``"inline_attn::inline_forward"``, registers a CPU implementation of it). On failure returns
    False, keeps the reason for :func:`cpu_kernel_error` and, with ``warn``, emits a
    RuntimeWarning saying that the eager path is used. The result is remembered per library.
    """
    try:
        spec = spec or kernel_spec(source)
    except KernelBuildError as e:
        return _fail(str(source), str(e), warn)
    folder = Path(cache) if cache is not None else cache_dir()
    path = spec.library(folder)
    memo = str(path)
    if memo in _loaded:
        return _loaded[memo]
    try:
        path = build_cpu_kernel(spec=spec, cache=folder, lock_timeout=lock_timeout)
        try:
            torch.ops.load_library(str(path))
        except OSError as e:
            raise KernelBuildError(f"cannot load {path} ({e}); rebuild it with `inline-attn build-kernel --force`")
        if op_name is not None and not torch._C._dispatch_has_kernel_for_dispatch_key(op_name, "CPU"):
            raise KernelBuildError(f"{path} loaded but registers no CPU kernel for {op_name}")
    except Exception as e:  # no compiler, a compile error, a read-only cache, a lock timeout
        msg = str(e) if isinstance(e, KernelBuildError) else f"{type(e).__name__}: {e}"
        return _fail(memo, msg, warn)
    _loaded[memo] = True
    _errors["last"] = None
    return True


def _fail(memo: str, msg: str, warn: bool) -> bool:
    _loaded[memo] = False
    _errors["last"] = msg
    if warn:
        warnings.warn(
            f"inline-attn: the fused CPU kernel is not available ({msg[:600]}); using the eager path "
            "(correct, slower at small N; INLINE_ATTN_IMPL=eager chooses it without trying the kernel)",
            RuntimeWarning,
            stacklevel=3,
        )
    return False


def cpu_kernel_error() -> Optional[str]:
    """Why the last :func:`load_cpu_kernel` failed (None after a success or before any call)."""
    return _errors["last"]
