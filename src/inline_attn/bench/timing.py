"""Interleaved timing and peak-memory measurement for benchmarks.

Timing: the cases compared are run round-robin (A, B, C, A, B, C, ...) after a warm-up, so a
burst of load from other processes hits every case alike; we report medians and ratios. On the
CPU the device is synchronised around every timed call and timed by the wall clock; on CUDA each
sample is timed by CUDA events over back-to-back calls.

Memory: on CUDA, the allocator's peak (``torch.cuda.max_memory_allocated``) above the level
before the call. On CPU, PyTorch's allocator keeps no statistics (and ``tracemalloc`` does not
see it), so :class:`TensorMemoryTracker` counts it exactly at the tensor level: a
``TorchDispatchMode`` adds the bytes of every new storage an aten op returns and subtracts them
when the storage is freed; the peak of that running sum is the peak memory of tensors created
during the call (activations, tensors saved for backward, gradients, temporaries that aten ops
materialise). Parameters and the inputs, which exist before the call, are not counted; scratch
buffers private to one fused kernel (e.g. the per-thread blocks of the CPU flash-attention
kernel) are not seen either.
"""

from __future__ import annotations

import math
import statistics
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .._memory import is_oom

__all__ = [
    "CaseTiming",
    "TensorMemoryTracker",
    "measure_matmul_rate",
    "peak_memory",
    "synchronize",
    "thread_times_interleaved",
    "time_interleaved",
]

OOM_STATUS = "OOM"


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued work on ``device`` (a no-op on CPU)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _release(device) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


@dataclass
class CaseTiming:
    """Timings of one case: seconds per call (``times``), or the reason it could not run.

    ``status`` is "ok", "OOM" or "error: <message>"; ``median`` is nan unless ok.
    """

    times: list[float] = field(default_factory=list)
    status: str = "ok"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.ok and self.times else math.nan

    @property
    def minimum(self) -> float:
        return min(self.times) if self.ok and self.times else math.nan


def failure_status(err: BaseException) -> str:
    """A benchmark row's status for a call that raised ``err``: the out-of-memory status, or
    ``"error: Type: first line"`` (at most 300 characters)."""
    if is_oom(err):
        return OOM_STATUS
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"error: {type(err).__name__}: {first}"[:300]


def _cuda_timer(fn: Callable[[], Any], inner: int, device) -> float:
    """Seconds per call of ``fn`` over ``inner`` back-to-back calls, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    synchronize(device)
    start.record()
    for _ in range(inner):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / inner


def _check_rounds(warmup, repeats, min_repeats, budget_s, min_sample_s) -> None:
    for name, value, low in (("warmup", warmup, 0), ("repeats", repeats, 1), ("min_repeats", min_repeats, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}={value!r}: expected an integer >= {low}")
    for name, value in (("budget_s", budget_s), ("min_sample_s", min_sample_s)):
        if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
            raise ValueError(f"{name}={value!r}: expected a finite number of seconds > 0")


def time_interleaved(
    cases: dict[str, Callable[[], Any]],
    *,
    warmup: int = 1,
    repeats: int = 5,
    min_repeats: int = 2,
    budget_s: Optional[float] = None,
    device: torch.device | str | None = None,
    min_sample_s: float = 2e-3,
) -> dict[str, CaseTiming]:
    """Time every case round-robin; a case that fails (OOM or error) is recorded, not raised.

    Args:
        cases: label -> zero-argument callable (one step: forward, or forward + backward).
        warmup: untimed calls per case before timing.
        repeats: timed rounds (each round calls every live case once).
        min_repeats: rounds always run; after them, a ``budget_s`` (seconds of timed work per
            case) ends the measurement early, so huge sizes do not run for ever.
        device: synchronised around each call. On CUDA each sample is timed with CUDA events
            over enough back-to-back calls to last ``min_sample_s`` (measured in the warm-up),
            so launch gaps of sub-millisecond steps do not dominate; on the CPU by the wall
            clock, one call per sample.
    Returns:
        label -> :class:`CaseTiming` (seconds per call). Counts out of range (no timed round, a
        negative warm-up) are a ValueError naming the value.
    """
    _check_rounds(warmup, repeats, min_repeats, budget_s, min_sample_s)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    cuda = dev.type == "cuda"
    out = {k: CaseTiming() for k in cases}
    inner = {k: 1 for k in cases}
    for label, fn in cases.items():
        try:
            for _ in range(warmup):
                fn()
            synchronize(device)
            if cuda:
                per_call = _cuda_timer(fn, 1, dev)
                inner[label] = max(1, min(1000, math.ceil(min_sample_s / max(per_call, 1e-7))))
        except Exception as err:  # noqa: BLE001 - every failure is recorded, the sweep goes on
            out[label].status = failure_status(err)
            _release(device)
    for rnd in range(repeats):
        live = [k for k in cases if out[k].ok]
        if not live:
            break
        for label in live:
            try:
                if cuda:
                    out[label].times.append(_cuda_timer(cases[label], inner[label], dev))
                    continue
                synchronize(device)
                t0 = time.perf_counter()
                cases[label]()
                synchronize(device)
                out[label].times.append(time.perf_counter() - t0)
            except Exception as err:  # noqa: BLE001
                out[label].status = failure_status(err)
                out[label].times.clear()
                _release(device)
        if budget_s is not None and rnd + 1 >= min_repeats:
            if max(sum(t * inner[k] for t in out[k].times) for k in live) > budget_s:
                break
    return out


def thread_times_interleaved(
    cases: dict[str, Callable[[], Any]], *, repeats: int, warmup: int = 0
) -> dict[str, list[float]]:
    """Each case's CPU seconds per call on this thread, ``repeats`` rounds round-robin after
    ``warmup`` untimed calls of each. This thread's CPU time, not the wall clock: on a shared
    machine the wall clock adds the time other processes hold the core, and with one intra-op
    thread every CPU kernel (a CPU backward included: the autograd engine runs it on the calling
    thread) runs on this thread, so its CPU time is the whole call."""
    _check_rounds(warmup, repeats, 1, None, 1.0)
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeats):
        for label, fn in cases.items():
            t0 = time.thread_time()
            fn()
            times[label].append(time.thread_time() - t0)
    return times


class TensorMemoryTracker(TorchDispatchMode):
    """Peak bytes of tensor storages created while the mode is active (see module docstring).

    Use as a context manager; read ``peak`` (bytes) afterwards. Views share their base's
    storage and are counted once.
    """

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._alive: dict[int, int] = {}

    def _freed(self, key: int, nbytes: int) -> None:
        if self._alive.pop(key, None) is not None:
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            st = t.untyped_storage()
            nbytes = st.nbytes()
            key = st.data_ptr()
            if nbytes == 0 or key in self._alive:
                continue
            self._alive[key] = nbytes
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(st, self._freed, key, nbytes)
        return out


def peak_memory(fn: Callable[[], Any], device: torch.device | str | None = None) -> tuple[float, str]:
    """Peak bytes allocated by one call of ``fn`` above what existed before it.

    Returns ``(bytes, status)``; ``bytes`` is nan when the call failed (status "OOM"/"error").
    CUDA: allocator statistics. CPU: :class:`TensorMemoryTracker` (tensor-level, exact).
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    try:
        if dev.type == "cuda":
            synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            base = torch.cuda.memory_allocated(dev)
            fn()
            synchronize(dev)
            return float(torch.cuda.max_memory_allocated(dev) - base), "ok"
        tracker = TensorMemoryTracker()
        with tracker:
            fn()
        return float(tracker.peak), "ok"
    except Exception as err:  # noqa: BLE001
        _release(dev)
        return math.nan, failure_status(err)


def measure_matmul_rate(
    n: int = 1024,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    repeats: int = 10,
) -> float:
    """Achieved FLOP/s of an ``n x n @ n x n`` matmul (median of ``repeats``): the machine's floor."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    a = torch.randn(n, n, dtype=dtype, device=dev)
    b = torch.randn(n, n, dtype=dtype, device=dev)
    res = time_interleaved({"mm": lambda: a @ b}, warmup=2, repeats=repeats, device=dev)["mm"]
    return 2.0 * n**3 / res.median
