"""Building the CPU kernel: killed builds, concurrent builds, held locks, read-only caches.

A tiny plain C++ library stands in for the kernel (it compiles in a fraction of a second); the
compiler is a wrapper script that counts its runs and, when asked, stalls so a build can be
killed midway. Each scenario that involves "a later process" runs real subprocesses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch

from inline_attn.cli import main
from inline_attn.ops.fused import cpu_build

PROBE_SOURCE = 'extern "C" int inline_attn_probe() { return 42; }\n'

CHILD = textwrap.dedent("""
    import ctypes, sys
    from inline_attn.ops.fused import cpu_build
    src, cxx, cache, timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    spec = cpu_build.kernel_spec(src, cxx=cxx, cflags=("-O0",), ldflags=(), link_torch=False)
    ok = cpu_build.load_cpu_kernel(spec=spec, cache=cache, lock_timeout=timeout, warn=False)
    print("ok" if ok else "failed", cpu_build.cpu_kernel_error())
    if ok:
        print("probe", ctypes.CDLL(str(spec.library(cache))).inline_attn_probe())
""")


@pytest.fixture
def probe(tmp_path):
    """(source, compiler wrapper, cache folder, compile-log file) for the probe library."""
    src = tmp_path / "probe.cpp"
    src.write_text(PROBE_SOURCE)
    log = tmp_path / "compiles.log"
    cxx = tmp_path / "cxx.sh"
    # $STALL_MARKER set: say so, then stall (the test kills us here); else compile with g++
    cxx.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        echo run >> {log}
        if [ -n "$STALL_MARKER" ]; then touch "$STALL_MARKER"; sleep 120; fi
        if [ -n "$SLOW_COMPILE" ]; then sleep "$SLOW_COMPILE"; fi
        exec g++ "$@"
    """)
    )
    cxx.chmod(0o755)
    return src, cxx, tmp_path / "cache", log


def _spec(probe):
    src, cxx, _, _ = probe
    return cpu_build.kernel_spec(src, cxx=str(cxx), cflags=("-O0",), ldflags=(), link_torch=False)


def _child(probe, timeout=60.0, **env):
    src, cxx, cache, _ = probe
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(src), str(cxx), str(cache), str(timeout)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **env},
    )


def _compiles(log) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _wait_for(path, proc, limit=60.0):
    t0 = time.time()
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"child exited early: {proc.communicate()}")
        assert time.time() - t0 < limit, f"{path} never appeared"
        time.sleep(0.05)


def test_build_killed_midway_does_not_block_the_next_process(probe, tmp_path):
    """A process killed while it compiles (holding the lock) leaves its lock file and build
    folder behind; the next process still builds, loads and cleans up, in bounded time."""
    _, _, cache, log = probe
    marker = tmp_path / "stalled"
    first = _child(probe, STALL_MARKER=str(marker))
    try:
        _wait_for(marker, first)
        os.killpg(first.pid, signal.SIGTERM)  # the process and its compiler, as a terminal's Ctrl-C would
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    spec = _spec(probe)
    assert spec.lock(cache).exists() and not spec.library(cache).exists()
    assert list(cache.glob(f".{spec.name}.build-*")), "the killed build left its temporary folder"
    t0 = time.time()
    second = _child(probe, timeout=30.0)
    out, err = second.communicate(timeout=120)
    took = time.time() - t0
    assert second.returncode == 0, err
    assert "ok None" in out and "probe 42" in out, (out, err)
    assert took < 60, f"the second build took {took:.0f} s"
    assert not list(cache.glob(f".{spec.name}.build-*")), "stale build folder not removed"
    assert _compiles(log) == 2


def test_concurrent_builds_compile_once_and_both_load(probe):
    _, _, cache, log = probe
    procs = [_child(probe, SLOW_COMPILE="1") for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "ok None" in out and "probe 42" in out, (out, err)
    assert _compiles(log) == 1  # the second builder waited on the lock, then found the library


def test_lock_held_elsewhere_times_out_with_a_message_naming_it(probe):
    _, _, cache, log = probe
    spec = _spec(probe)
    cache.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
            "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(120)",
            str(spec.lock(cache)),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.time()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ok = cpu_build.load_cpu_kernel(spec=spec, cache=cache, lock_timeout=1.0)
        took = time.time() - t0
    finally:
        holder.kill()
        holder.wait()
    assert not ok and took < 10
    err = cpu_build.cpu_kernel_error()
    assert str(spec.lock(cache)) in err and "INLINE_ATTN_KERNEL_LOCK_TIMEOUT" in err
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any(str(spec.lock(cache)) in m and "eager path" in m for m in msgs), msgs
    assert _compiles(log) == 0


def _snapshot(folder):
    return sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir())


def test_prebuilt_library_in_a_read_only_cache_is_used_as_is(probe):
    _, _, cache, log = probe
    spec = _spec(probe)
    path = cpu_build.build_cpu_kernel(spec=spec, cache=cache)
    assert path == spec.library(cache) and path.is_file() and _compiles(log) == 1
    spec.lock(cache).unlink()  # a shipped cache holds the library only
    before = _snapshot(cache)
    cache.chmod(0o555)
    try:
        out, err = _child(probe).communicate(timeout=120)
    finally:
        cache.chmod(0o755)
    assert "ok None" in out and "probe 42" in out, (out, err)
    assert _snapshot(cache) == before  # nothing written: no lock file, no rebuild
    assert _compiles(log) == 1


def test_read_only_cache_without_the_library_is_a_clear_error(probe, monkeypatch):
    _, _, cache, _ = probe
    cache.mkdir()
    real_access = os.access
    monkeypatch.setattr(cpu_build.os, "access", lambda p, mode: False if str(p) == str(cache) else real_access(p, mode))
    with pytest.raises(cpu_build.KernelBuildError, match=r"read-only and holds no .*inline-attn build-kernel"):
        cpu_build.build_cpu_kernel(spec=_spec(probe), cache=cache)


def test_compile_error_is_reported_with_the_compiler_output(tmp_path):
    src = tmp_path / "broken.cpp"
    src.write_text("int f( {\n")
    spec = cpu_build.kernel_spec(src, cflags=("-O0",), ldflags=(), link_torch=False)
    with pytest.warns(RuntimeWarning, match="eager path"):
        assert not cpu_build.load_cpu_kernel(spec=spec, cache=tmp_path / "cache")
    err = cpu_build.cpu_kernel_error()
    assert "broken.cpp failed" in err and "error" in err
    assert not list((tmp_path / "cache").glob(".*build-*"))  # the failed build cleaned up after itself


def test_cache_key_covers_source_flags_compiler_and_torch(tmp_path, monkeypatch):
    a, b = tmp_path / "a.cpp", tmp_path / "b.cpp"
    a.write_text(PROBE_SOURCE)
    b.write_text(PROBE_SOURCE + "// changed\n")
    base = cpu_build.kernel_spec(a, link_torch=False)
    assert base.key == cpu_build.kernel_spec(a, link_torch=False).key  # deterministic
    others = [
        cpu_build.kernel_spec(b, link_torch=False),
        cpu_build.kernel_spec(a, cflags=("-O2",), link_torch=False),
        cpu_build.kernel_spec(a, cxx="clang++", link_torch=False),
    ]
    monkeypatch.setattr(torch, "__version__", "9.9.9+other")
    others.append(cpu_build.kernel_spec(a, link_torch=False))
    assert len({base.key, *(s.key for s in others)}) == 5
    assert "9.9.9_other" in others[-1].name


def test_cache_folder_and_lock_timeout_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("INLINE_ATTN_KERNEL_CACHE", str(tmp_path / "k"))
    assert cpu_build.cache_dir() == tmp_path / "k"
    monkeypatch.setenv("INLINE_ATTN_KERNEL_LOCK_TIMEOUT", "soon")
    with pytest.raises(cpu_build.KernelBuildError, match="INLINE_ATTN_KERNEL_LOCK_TIMEOUT='soon'"):
        cpu_build._lock_timeout(None)


def test_build_kernel_command_prints_the_library_path(capsys):
    """Builds (or finds) the real kernel in the default cache, as the first model call would."""
    assert main(["build-kernel"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(cpu_build.kernel_spec().library()) and os.path.isfile(printed)


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_truncated_library_is_rebuilt_not_a_bus_error(probe):
    """A library cut to half its size keeps valid ELF headers whose segments reach past the end
    of the file: dlopen maps them and the process dies of SIGBUS (exit 135, no message). The
    size and sha256 recorded at build time catch it before the load, so it is rebuilt."""
    _, _, cache, log = probe
    spec = _spec(probe)
    path = cpu_build.build_cpu_kernel(spec=spec, cache=cache)
    _truncate(path)
    proc = _child(probe)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (proc.returncode, out, err)  # -7 / 135 is SIGBUS: the regression
    assert "ok None" in out and "probe 42" in out, (out, err)
    assert str(path) in err and "does not match its build" in err and "rebuilding" in err, err
    assert _compiles(log) == 2 and cpu_build.library_mismatch(spec, cache) is None
    record = json.loads((cache / f"{spec.name}.json").read_text())  # the record beside the rebuilt library
    assert record["size"] == path.stat().st_size and len(record["sha256"]) == 64


@pytest.mark.parametrize("damage", ["truncated", "no-record"])
def test_damaged_library_in_a_read_only_cache_is_skipped_with_a_warning(probe, damage):
    """Nothing can be rebuilt: the process goes on with the eager path, told the file and the fix."""
    _, _, cache, log = probe
    spec = _spec(probe)
    path = cpu_build.build_cpu_kernel(spec=spec, cache=cache)
    if damage == "truncated":
        _truncate(path)
    else:  # a library built before the records existed is not trusted either
        spec.record(cache).unlink()
    # read-only to this process even when it runs as root (chmod does not stop root)
    read_only = (
        "import os; from inline_attn.ops.fused import cpu_build; real = os.access; "
        f"cpu_build.os.access = lambda p, m: False if str(p) == {str(cache)!r} else real(p, m)\n"
    )
    src, cxx, _, _ = probe
    proc = subprocess.run(
        [sys.executable, "-c", read_only + CHILD, str(src), str(cxx), str(cache), "60"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, (proc.returncode, out, err)
    assert out.startswith("failed") and str(path) in out and "build-kernel --force" in out, out
    assert _compiles(log) == 1


def test_messages_name_only_settings_that_exist():
    """Every INLINE_ATTN_* setting the package mentions (in a warning, an error, a docstring) is
    one it reads: the kernel lock timeout once recommended INLINE_ATTN_CPU_KERNEL=0, read by nothing."""
    import pathlib
    import re

    code = "\n".join(p.read_text() for p in pathlib.Path(cpu_build.__file__).parents[2].rglob("*.py"))
    read = set(re.findall(r"(?:\.get|getenv)\(\s*\"(INLINE_ATTN_\w+)\"", code))  # os.environ.get, env.get, getenv
    read |= set(re.findall(r"environ\[\"(INLINE_ATTN_\w+)\"\]", code))
    named = set(re.findall(r"INLINE_ATTN_\w+", code))
    assert {"INLINE_ATTN_IMPL", "INLINE_ATTN_KERNEL_LOCK_TIMEOUT", "INLINE_ATTN_KERNEL_CACHE"} <= read, read
    assert named <= read, f"the package names settings nothing reads: {sorted(named - read)}"


def test_a_build_says_so_on_stderr_once(probe, capsys):
    _, _, cache, log = probe
    spec = _spec(probe)
    cpu_build.build_cpu_kernel(spec=spec, cache=cache)
    err = capsys.readouterr().err
    assert err.count("inline-attn: building the fused CPU kernel") == 1, err
    assert str(spec.library(cache)) in err and "inline-attn build-kernel" in err and "INLINE_ATTN_IMPL=eager" in err
    cpu_build.build_cpu_kernel(spec=spec, cache=cache)  # cached: silent
    assert capsys.readouterr().err == "" and _compiles(log) == 1
