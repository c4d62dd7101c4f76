"""Launching compiled Triton kernels without Triton's per-call dispatch (CUDA only).

``kernel[grid](*args, **meta)`` binds the arguments, specializes each one, builds a cache key,
looks the compiled kernel up, checks the globals it read, canonicalizes the grid and builds the
launch metadata before it launches: about as long as the launch itself, on each of a layer's
five launches a training step (an eager InLine-DeiT-T step was host-bound on an H200, 28.2 ms
of host time against the softmax twin's 22.7). :func:`launch` keeps, per kernel, compile-time
arguments, device and argument specialization, the kernel Triton compiled for the first such
call, and launches it directly afterwards, as Triton's own ``CompiledKernel.__getitem__`` does.

The key (:func:`specialization`) must tell apart every two argument lists that Triton compiles
differently: tensors by dtype and by the 16-byte alignment of their data, integers by being 1,
by divisibility by 16 and by width, other scalars by type (bools and None by value). It may be
finer than Triton's (a finer key costs one more first call through Triton), never coarser:
``tests/ops/test_launch_cache.py`` checks it against Triton's own binder on the installed version.
Launch hooks (profilers such as proton register them) send every launch through Triton.
"""

from __future__ import annotations

import functools

import torch

_I32, _I64 = 2**31, 2**63
_entries: dict = {}
_NOT_CACHED = object()  # a kernel whose compile-time arguments are not all in meta: always through Triton


def specialization(args) -> tuple:
    """What Triton's compilation of ``args`` depends on (a tuple, flattened over tuple arguments)."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key += (a.dtype, a.data_ptr() % 16 == 0)
        elif type(a) is int:
            key += (a == 1, a % 16 == 0, 0 if -_I32 <= a < _I32 else 1 if -_I64 <= a < _I64 else 2)
        elif isinstance(a, tuple):
            key.append(specialization(a))
        elif a is None or type(a) is bool:
            key.append(a)
        else:
            key.append(type(a))
    return tuple(key)


def _hooked() -> bool:
    runtime = _runtime_knobs()
    return bool(runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls)


@functools.cache
def _runtime_knobs():
    """Triton's runtime knobs, imported on the first launch (triton is optional: not at import time)."""
    from triton import knobs

    return knobs.runtime


def _entry(kernel, compiled, n_args: int, meta: dict):
    """(the compiled kernel's launcher, its function, its packed metadata, the compile-time
    arguments in the kernel's parameter order), or _NOT_CACHED."""
    names = kernel.arg_names[n_args:]
    if compiled is None or any(name not in meta for name in names):
        return _NOT_CACHED
    return compiled.run, compiled.function, compiled.packed_metadata, tuple(meta[name] for name in names)


def launch(kernel, grid: tuple, args: tuple, meta: dict) -> None:
    """``kernel[grid](*args, **meta)`` on the current CUDA device, through Triton only the first
    time for these compile-time arguments and this argument specialization."""
    device = torch.cuda.current_device()
    key = (kernel, device, *meta.items(), *specialization(args))
    entry = _entries.get(key)
    if entry is None or entry is _NOT_CACHED or _hooked():
        compiled = kernel[grid](*args, **meta)
        if entry is None:
            _entries[key] = _entry(kernel, compiled, len(args), meta)
        return
    run, function, packed, constexprs = entry
    g0, g1, g2 = (*grid, 1, 1)[:3]
    stream = torch._C._cuda_getCurrentRawStream(device)
    run(g0, g1, g2, stream, function, packed, None, None, None, *args, *constexprs)
