"""Compile a manifest of planned launches (:mod:`.triton_cache`) into a Triton cache folder for sm_90.

Runs in a side venv that holds the device's Python and triton and nothing else (no torch, no
inline_attn install): the kernel modules are loaded from this tree's files under their own names
(their package's ``__init__`` is not run), tensors are stand-ins with a dtype and an aligned
address, and Triton compiles for sm_90 through a stand-in driver, so no GPU is needed::

    python -m tools.gpu_check.triton_prebuild MANIFEST CACHE

CACHE then holds one folder per configuration with what a launch reads on a cache hit: the cubin,
its metadata and the group file, whose absolute paths gpu-check rewrites when it installs the cache
(:func:`install`); the intermediate files (source, TTIR, TTGIR, LLVM IR, PTX) are dropped, which
keeps the folder small enough to carry. ``prebuilt.json`` records the Triton version, its cache key
(:func:`triton.runtime.cache.triton_key`), the Python version and the configurations.
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import shutil
import sys
import time
import types

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
KERNEL_MODULES = ("inline_attn.ops.fused.triton_kernels", "inline_attn.ops.fused.triton_stream")
KEPT = (".cubin", ".json")  # what a cache hit reads (CompiledKernel: the binary and the metadata)
RECORD = "prebuilt.json"


class _Dtype:
    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"  # Triton canonicalises a tensor's dtype from this text


_DTYPES: dict = {}  # one object per dtype, alive for the process: Triton caches what it read per dtype object


class _Tensor:
    """A tensor argument as Triton's binder reads it: a dtype and a 16-byte-aligned address."""

    def __init__(self, dtype: str):
        self.dtype = _DTYPES.setdefault(dtype, _Dtype(dtype))

    def data_ptr(self) -> int:
        return 0


class _Driver:
    """Triton's active driver for an sm_90 GPU that is not here."""

    def __init__(self, capability: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", capability, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


def _kernels() -> dict:
    """The launchable kernels of :data:`KERNEL_MODULES`, loaded from SRC without running the packages'
    ``__init__`` (which imports torch)."""
    for name in ("inline_attn", "inline_attn.ops", "inline_attn.ops.fused"):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(SRC.joinpath(*name.split(".")))]
            sys.modules[name] = package
    kernels = {}
    for name in KERNEL_MODULES:
        kernels.update((k, f) for k, f in vars(importlib.import_module(name)).items() if hasattr(f, "warmup"))
    return kernels


def decode(value):
    """:func:`.triton_cache.encode` undone, tensors as :class:`_Tensor`."""
    if isinstance(value, dict) and "tensor" in value:
        return _Tensor(value["tensor"])
    if isinstance(value, dict) and "tuple" in value:
        return tuple(decode(v) for v in value["tuple"])
    return value


def _prune(cache: pathlib.Path) -> None:
    """Keep in each configuration's folder only the files a cache hit reads, and its group file
    listing only those."""
    for group in cache.glob("*/__grp__*.json"):
        children = json.loads(group.read_text())["child_paths"]
        kept = {}
        for name, path in children.items():
            if name.endswith(KEPT):
                kept[name] = path
            else:
                pathlib.Path(path).unlink(missing_ok=True)
        group.write_text(json.dumps({"child_paths": kept}))


def build(manifest: pathlib.Path, cache: pathlib.Path) -> dict:
    """Compile every launch of ``manifest`` into ``cache`` (emptied first) -> the record written to
    ``cache / RECORD``."""
    if cache.exists():
        shutil.rmtree(cache)
    cache.mkdir(parents=True)
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    import triton
    from triton.runtime.cache import triton_key
    from triton.runtime.driver import driver

    plan = json.loads(manifest.read_text())
    driver.set_active(_Driver(plan["target"]))
    kernels, t0 = _kernels(), time.time()
    for launch in plan["launches"]:
        args = [decode(a) for a in launch["args"]]
        kernels[launch["kernel"]].warmup(*args, grid=(1,), **launch["meta"])
    _prune(cache)
    record = {
        "triton": triton.__version__,
        "triton_key": triton_key(),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "target": plan["target"],
        "configurations": len(list(cache.glob("*/__grp__*.json"))),
        "launches": len(plan["launches"]),
        "autotune": bool(plan.get("autotune")),  # the autotune step's candidates planned too
        "seconds": round(time.time() - t0, 1),
    }
    (cache / RECORD).write_text(json.dumps(record, indent=1))
    return record


def install(prebuilt: pathlib.Path, cache: pathlib.Path) -> dict:
    """Copy a prebuilt cache to ``cache`` (where ``TRITON_CACHE_DIR`` will point), its group files'
    absolute paths rewritten to the new place -> its record. Needs no triton."""
    shutil.copytree(prebuilt, cache, dirs_exist_ok=True)
    for group in cache.glob("*/__grp__*.json"):
        children = json.loads(group.read_text())["child_paths"]
        moved = {name: str(group.parent / name) for name in children}
        group.write_text(json.dumps({"child_paths": moved}))
    return json.loads((cache / RECORD).read_text())


def entries(cache: pathlib.Path) -> int:
    """The compiled configurations in a cache folder (one folder each; Triton's launcher modules too)."""
    return sum(1 for p in cache.iterdir() if p.is_dir()) if cache.is_dir() else 0


def describe(record: dict) -> str:
    """'38 configurations for sm_90, triton 3.6.0 on Python 3.12' (', with the autotune step's
    candidates' where they were planned)."""
    return (
        f"{record['configurations']} configurations for sm_{record['target']}, "
        f"triton {record['triton']} on Python {record['python']}"
        + (", with the autotune step's candidates" if record.get("autotune") else "")
    )


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m tools.gpu_check.triton_prebuild MANIFEST CACHE", file=sys.stderr)
        return 2
    record = build(pathlib.Path(argv[0]), pathlib.Path(argv[1]))
    size = sum(f.stat().st_size for f in pathlib.Path(argv[1]).rglob("*") if f.is_file())
    print(f"{describe(record)}: compiled in {record['seconds']} s, {size / 1e6:.1f} MB -> {argv[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
