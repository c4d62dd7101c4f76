"""The prebuilt Triton cache on the lease (:mod:`.triton_prebuild`): installed before the steps, so
that the kernels the checks launch load instead of compiling, and its hits counted after them.

``make gpu-check-cache`` builds it before the lease into :data:`PREBUILT` (carried to the device
with the tree: name it in the run's ``carry``). Installed only when its record's Triton cache key is
the device's own (the same triton build on the same Python); otherwise the check compiles cold, as
without it, and the summary says why.
"""

from __future__ import annotations

import os
import pathlib

from . import triton_prebuild

PREBUILT = pathlib.Path(__file__).resolve().parents[2] / ".triton-cache" / "sm90"
INSTALLED = pathlib.Path("/tmp/inline-attn-triton-cache")


def install(prebuilt: pathlib.Path = PREBUILT, cache: pathlib.Path = INSTALLED) -> dict:
    """Point ``TRITON_CACHE_DIR`` at ``cache`` holding the prebuilt configurations when they match
    this machine's Triton (before anything compiles) -> the device record's ``triton_cache`` entries."""
    if not (prebuilt / triton_prebuild.RECORD).is_file():
        return {
            "triton_cache": f"no prebuilt cache ({prebuilt} is missing: make gpu-check-cache): kernels compile cold"
        }
    from triton.runtime.cache import triton_key

    record = triton_prebuild.install(prebuilt, cache)
    if record["triton_key"] != triton_key():
        import triton

        why = f"prebuilt for {triton_prebuild.describe(record)}; this machine has triton {triton.__version__}"
        return {"triton_cache": f"not used ({why}, another cache key): kernels compile cold"}
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    n = triton_prebuild.entries(cache)
    return {"triton_cache": f"prebuilt, {triton_prebuild.describe(record)}", "triton_cache_entries": n}


def compiled_here(env: dict, cache: pathlib.Path = INSTALLED) -> str:
    """What the steps compiled on the device beside the prebuilt configurations (one line)."""
    if "triton_cache_entries" not in env:
        return env["triton_cache"]
    new = triton_prebuild.entries(cache) - env["triton_cache_entries"]
    return f"{env['triton_cache']}; {new} more compiled on the device (tests, compiled graphs, shapes not planned)"


def dry_run_line(prebuilt: pathlib.Path = PREBUILT, autotune: bool = False) -> str:
    """The plan's line about the prebuilt cache (no triton needed); ``autotune``: the run has the
    autotune step, whose candidates (about a hundred configurations) the cache should hold."""
    record_file = prebuilt / triton_prebuild.RECORD
    if not record_file.is_file():
        return f"triton cache: none at {prebuilt} (make gpu-check-cache; the kernels would compile cold)"
    import json

    size = sum(f.stat().st_size for f in prebuilt.rglob("*") if f.is_file())
    record = json.loads(record_file.read_text())
    line = f"triton cache: {triton_prebuild.describe(record)}, {size / 1e6:.1f} MB (carry .triton-cache)"
    if autotune and not record.get("autotune"):
        line += (
            "; without the autotune step's candidates, which would compile cold in its box "
            "(make gpu-check-cache GPU_CHECK_ARGS='--steps ... autotune')"
        )
    return line
