"""What ``torch.profiler`` events say about a step's kernels: the GPU-busy time, the kernel count,
the top kernels, InLine's own kernels' time, and which SDPA backend a softmax step ran."""

from __future__ import annotations

from typing import Callable, Iterable

import torch

# the InLine Triton kernels' names begin so (inline_fwd_fused, inline_bwd_partial, predictor_bwd, ...)
INLINE_KERNEL_PREFIXES = ("inline_", "predictor_")
TOP_KERNELS = 8


def _device_events(events: Iterable) -> list:
    """The kernels among profiler events: events on the GPU that are not user annotations. A
    user annotation (``Optimizer.step#AdamW.step``, a ``record_function`` span) appears on the GPU's
    timeline too, spanning its kernels and the host gaps between them: counted, it would count its
    kernels twice and the gaps as GPU time (PyTorch's own table leaves them out the same way)."""
    cuda = torch.autograd.DeviceType.CUDA
    return [
        e for e in events if getattr(e, "device_type", None) == cuda and not getattr(e, "is_user_annotation", False)
    ]


def _self_us(event) -> float:
    return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)


def device_busy_ms(events: Iterable) -> float:
    """Milliseconds of device (kernel) time in profiler events: the self device time of the kernels
    that ran on the GPU. Operator rows, which repeat their kernels' time, and user annotations,
    whose spans cover their kernels and host gaps, are not counted."""
    return sum(_self_us(e) for e in _device_events(events)) / 1e3


def kernel_stats(events: Iterable, steps: int, top: int = TOP_KERNELS) -> dict:
    """Per step of ``steps`` profiled ones: GPU-busy ms, kernels launched, the InLine kernels' ms
    (:data:`INLINE_KERNEL_PREFIXES`), and the ``top`` kernels by time (name, ms, calls)."""
    by_name: dict[str, list[float]] = {}
    for e in _device_events(events):
        entry = by_name.setdefault(e.name, [0.0, 0])
        entry[0] += _self_us(e) / 1e3
        entry[1] += 1
    busy = sum(ms for ms, _ in by_name.values())
    inline = sum(ms for name, (ms, _) in by_name.items() if name.startswith(INLINE_KERNEL_PREFIXES))
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "gpu_busy_ms": busy / steps,
        "kernels": sum(n for _, n in by_name.values()) / steps,
        "inline_ms": inline / steps,
        "top": [{"name": name[:90], "ms": ms / steps, "calls": n / steps} for name, (ms, n) in ranked],
    }


def sdpa_backend(step: Callable[[], object]) -> str:
    """Which SDPA backend a step's softmax ran (cudnn, flash, efficient or math), from the names
    of the kernels in one profiled call."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    names = " ".join(e.name.lower() for e in prof.events())
    for backend, marks in (("cudnn", ("cudnn",)), ("flash", ("flash",)), ("efficient", ("fmha", "efficient"))):
        if any(m in names for m in marks):
            return backend
    return "math"
