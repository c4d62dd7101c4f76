"""Benchmark harness: attention layers and whole models, timed side by side.

``bench_attention`` (the layers over token grids) and ``bench_models`` (registered models at
resolutions / windows, presets for the paper's Fig. 6) return ``{"meta", "rows"}`` results;
:mod:`.report` prints and writes them; :mod:`.timing` holds the interleaved timer and the
peak-memory measurement; :mod:`.sweep` what both benchmarks share (a step's run context, timing
one sweep point).
"""

from .attention import bench_attention
from .flops import attention_layer_flops, counted_layer_flops
from .model import ModelCase, bench_models, parse_model_spec, preset_cases
from .report import format_table, plot_sweep, write_results
from .timing import TensorMemoryTracker, measure_matmul_rate, peak_memory, time_interleaved

__all__ = [
    "ModelCase",
    "TensorMemoryTracker",
    "attention_layer_flops",
    "counted_layer_flops",
    "bench_attention",
    "bench_models",
    "format_table",
    "measure_matmul_rate",
    "parse_model_spec",
    "peak_memory",
    "plot_sweep",
    "preset_cases",
    "time_interleaved",
    "write_results",
]
