"""The device record of a check: the GPU, its driver, the library versions and its copy rate."""

from __future__ import annotations

import subprocess
import sys

import torch


def versions() -> dict:
    """The GPU (name, multiprocessors, memory), its driver, and the torch / CUDA / triton / Python versions."""
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "not installed"
    props = torch.cuda.get_device_properties(0)
    info.update(device=props.name, sms=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1))
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        info["driver"] = smi.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["driver"] = "unknown"
    return info


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second: the memory-bound ceiling."""
    from inline_attn.bench.timing import time_interleaved

    x = torch.empty(1 << 28, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    t = time_interleaved({"copy": lambda: y.copy_(x)}, warmup=3, repeats=10, device="cuda")["copy"].median
    x = y = None  # free the 1 GiB before emptying the cache
    torch.cuda.empty_cache()
    return 2 * (1 << 28) * 2 / t
