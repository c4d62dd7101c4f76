"""``torch.compile`` with one vocabulary of modes for training and the benchmarks.

The fused InLine op compiles as one opaque node (a custom op), so every mode keeps it in the graph.
``reduce-overhead`` adds CUDA graphs: one launch replays a whole step's kernels, which is what
small layers and tiny models wait on when a step is bound by the host (docs/benchmarks.md#gpu);
on the CPU it compiles like ``default``.
"""

from __future__ import annotations

import torch

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def check_compile_mode(mode: str) -> str:
    if mode not in COMPILE_MODES:
        raise ValueError(f"unknown compile mode {mode!r}: expected one of {COMPILE_MODES}")
    return mode


def compile_module(module: torch.nn.Module, mode: str = "default") -> torch.nn.Module:
    """``torch.compile(module, mode=mode)`` after checking ``mode`` (one of :data:`COMPILE_MODES`)."""
    return torch.compile(module, mode=check_compile_mode(mode))
