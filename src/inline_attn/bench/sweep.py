"""What the layer and model benchmarks share: how a step runs, and how one sweep point is measured.

A sweep point (one grid side in ``bench attention``, one resolution or window in ``bench model``)
is a set of cases, each a zero-argument step; :func:`measure_point` optionally captures the steps
in CUDA graphs, times them interleaved (:func:`.timing.time_interleaved`) and measures each timed
case's peak memory, and hands back one :class:`Measured` per case, failed cases included.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional

import torch

from ..runtime.graphs import graph_steps
from ..ops import use_impl
from .timing import peak_memory, time_interleaved

__all__ = [
    "Measured",
    "PointTiming",
    "dtype_name",
    "measure_point",
    "check_counts",
    "check_positive",
    "check_stem",
    "resolve_device",
    "resolve_dtype",
    "run_context",
]

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float64": torch.float64,
}

# SDPA held to one backend: math is the explicit N x N softmax; the others error where they cannot run
SDPA_VARIANTS = {"math": "MATH", "flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"float32"`` / ``"bf16"`` / ... (or a dtype) -> the torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}: expected one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def resolve_device(device: str | torch.device) -> torch.device:
    """The benchmarks' ``device``: ``cpu``, ``cuda`` or ``cuda:N`` of this machine, else a ValueError."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"--device {device!r}: expected cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r}: the benchmarks run on cpu or cuda (cuda:N)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device!r}: CUDA is not available in this build or machine")
    return dev


def check_positive(flag: str, value: Optional[int]) -> None:
    """``value`` None (the default) or an integer >= 1, else a ValueError naming ``flag``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{flag} {value!r}: expected an integer >= 1")


def check_counts(*, warmup: int, repeats: int, threads: Optional[int] = None) -> None:
    """The timing counts: ``warmup`` >= 0 untimed calls, ``repeats`` >= 1 timed rounds, ``threads``
    None (torch's choice) or >= 1; a ValueError naming the flag otherwise."""
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"--warmup {warmup!r}: expected an integer >= 0")
    check_positive("--repeats", repeats)
    check_positive("--threads", threads)


def check_stem(name: str) -> str:
    """An output file stem that stays in the output folder: a plain name, no folder in it."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"--name {name!r}: expected a file name without folders (the files go into --out)")
    return name


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``, as results record it."""
    return str(dtype).replace("torch.", "")


def run_context(
    device_type: str, *, impl: Optional[str] = None, sdpa: Optional[str] = None, amp: Optional[torch.dtype] = None
) -> contextlib.ExitStack:
    """The context a benchmark step runs in: the InLine implementation ``impl`` (``"eager"``: without
    the fused kernels), SDPA held to the backend ``sdpa`` (a key of :data:`SDPA_VARIANTS`; others
    leave PyTorch's choice) and autocast to ``amp`` on ``device_type``."""
    stack = contextlib.ExitStack()
    if impl is not None:
        stack.enter_context(use_impl(impl))
    if sdpa in SDPA_VARIANTS:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        stack.enter_context(sdpa_kernel(getattr(SDPBackend, SDPA_VARIANTS[sdpa])))
    if amp is not None:
        stack.enter_context(torch.autocast(device_type, dtype=amp))
    return stack


@dataclass(frozen=True)
class PointTiming:
    """How every sweep point is measured: ``warmup``, ``repeats`` and ``budget_s`` as in
    :func:`.timing.time_interleaved`; ``memory``: each timed case's peak memory (one extra untimed
    call); ``cuda_graphs``: capture the steps in CUDA graphs first."""

    warmup: int
    repeats: int
    budget_s: Optional[float]
    memory: bool
    cuda_graphs: bool


@dataclass
class Measured:
    """One case of a sweep point: seconds per call (``median``, ``minimum``; nan unless timed), the
    number of timed calls, peak bytes of one call (nan unless measured) and the status ("ok", "OOM"
    or "error: ...", from building, timing or the memory call)."""

    median: float = math.nan
    minimum: float = math.nan
    repeats: int = 0
    peak: float = math.nan
    status: str = "error"
    timed: bool = False  # the timing succeeded (even where the memory call then failed)


def measure_point(
    steps: dict[Hashable, Callable[[], Any]],
    failures: dict[Hashable, str],
    timing: PointTiming,
    *,
    device: torch.device,
    compiled: tuple = (),
) -> tuple[dict[Hashable, Callable[[], Any]], dict[Hashable, Measured], Optional[str]]:
    """Time one sweep point's cases interleaved -> (steps as timed, case -> :class:`Measured`, why not graphed).

    Args:
        steps: case -> step; cases that could not be built are in ``failures`` (case -> status) instead.
        timing: how (:class:`PointTiming`). With ``timing.cuda_graphs`` the steps are captured
            (:func:`inline_attn.runtime.graphs.graph_steps`) except the ``compiled`` cases (inductor
            graphs those itself); the third value says why they run ungraphed (None when graphed
            or not asked for).
    """
    why_not = None
    if timing.cuda_graphs:
        steps, why_not = graph_steps(steps, device, skip=compiled)
    timings = time_interleaved(
        steps, warmup=timing.warmup, repeats=timing.repeats, budget_s=timing.budget_s, device=device
    )
    out = {key: Measured(status=status) for key, status in failures.items()}
    for key, t in timings.items():
        out[key] = Measured(t.median, t.minimum, len(t.times), math.nan, t.status, t.ok)
        if timing.memory and t.ok:
            peak, status = peak_memory(steps[key], device)
            out[key].peak = peak
            if status != "ok":
                out[key].status = status
    return steps, out, why_not
