"""Launching compiled Triton kernels without Triton's per-call dispatch (CUDA only).

``kernel[grid](*args, **meta)`` binds the arguments, specializes each one, builds a cache key,
looks the compiled kernel up, checks the globals it read, canonicalizes the grid and builds the
launch metadata before it launches: about as long as the launch itself, on each of a layer's
five launches a training step (an eager InLine-DeiT-T step was host-bound on an H200, 28.2 ms
of host time against the softmax twin's 22.7). :func:`launch` keeps, per kernel, compile-time
arguments, device and argument specialization, the kernel Triton compiled for the first such
call, and launches it directly afterwards, as Triton's own ``CompiledKernel.__getitem__`` does.

The key (:func:`specialization`) must tell apart every two argument lists that Triton compiles
differently: tensors by dtype and by their data's address modulo 16, integers (alone or in
the tuples the kernels take: strides, the geometry) by value, which is finer than Triton's (being
1, divisibility by 16, width) and cheap (a tuple is hashed in C, not walked in Python: about 5 us
a launch instead of 11 on a 2-core CPU), floats by type, bools and None by value. It may be finer
than Triton's (a finer key costs one more first call through Triton, for each layer shape), never
coarser: ``tests/ops/test_launch_cache.py`` checks it against Triton's own binder on the installed
version. A tuple holding anything but integers is not cached (a tensor in it would be keyed by
identity, not by dtype and alignment). At most ENTRIES_MAX keys are kept; past them the table
starts over (a process that meets thousands of shapes). Launch hooks (profilers such as proton
register them) send every launch through Triton.
"""

from __future__ import annotations

import functools

import torch

ENTRIES_MAX = 4096
_entries: dict = {}
_NOT_CACHED = object()  # always through Triton: compile-time arguments not all in meta, or a tuple of non-integers
_TENSORS = (torch.Tensor, torch.nn.Parameter)  # the arguments' usual types, tested first


def specialization(args) -> tuple:
    """What Triton's compilation of ``args`` depends on, or finer: a tensor's dtype and its data's
    address modulo 16, a float's type, anything else (integers, tuples of them, bools, None) as
    itself. Tensors first, by exact type: most arguments are."""
    key = []
    for a in args:
        kind = type(a)
        if kind in _TENSORS or (kind is not float and isinstance(a, torch.Tensor)):
            key += (a.dtype, a.data_ptr() & 15)
        elif kind is float:
            key.append(float)
        else:
            key.append(a)
    return tuple(key)


def _cacheable(args) -> bool:
    """Whether :func:`specialization` covers ``args``: every tuple among them holds integers only."""
    return all(type(a) is not tuple or all(type(x) is int for x in a) for a in args)


def _hooked() -> bool:
    runtime = _runtime_knobs()
    return bool(runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls)


@functools.cache
def _runtime_knobs():
    """Triton's runtime knobs, imported on the first launch (triton is optional: not at import time)."""
    from triton import knobs

    return knobs.runtime


def _entry(kernel, compiled, args: tuple, meta: dict):
    """(the compiled kernel's launcher, its function, its packed metadata, the compile-time
    arguments in the kernel's parameter order), or _NOT_CACHED."""
    names = kernel.arg_names[len(args) :]
    if compiled is None or any(name not in meta for name in names) or not _cacheable(args):
        return _NOT_CACHED
    return compiled.run, compiled.function, compiled.packed_metadata, tuple(meta[name] for name in names)


def lookup(kernel, device: int, args: tuple, meta: dict) -> tuple:
    """(the key of a launch of ``kernel`` on CUDA device ``device``, its cached entry or None)."""
    key = (kernel, device, *meta.items(), *specialization(args))
    return key, _entries.get(key)


def launch(kernel, grid: tuple, args: tuple, meta: dict) -> None:
    """``kernel[grid](*args, **meta)`` on the current CUDA device, through Triton only the first
    time for these compile-time arguments and this argument specialization."""
    device = torch.cuda.current_device()
    key, entry = lookup(kernel, device, args, meta)
    if entry is None or entry is _NOT_CACHED or _hooked():
        compiled = kernel[grid](*args, **meta)
        if entry is None:
            if len(_entries) >= ENTRIES_MAX:
                _entries.clear()
            _entries[key] = _entry(kernel, compiled, args, meta)
        return
    run, function, packed, constexprs = entry
    g0, g1, g2 = (*grid, 1, 1)[:3]
    stream = torch._C._cuda_getCurrentRawStream(device)
    run(g0, g1, g2, stream, function, packed, None, None, None, *args, *constexprs)
