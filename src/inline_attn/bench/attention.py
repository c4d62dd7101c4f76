"""``bench attention``: the InLine, linear and softmax layers side by side over token grids.

For each square grid (14x14 ... 112x112 tokens) every layer kind is timed in one interleaved
run: forward (eval, no grad) and forward + backward (gradients of the input and parameters).
Layer kinds (:data:`LAYER_KINDS`): ``inline`` (the fused kernels where they apply: C++ on the CPU,
Triton on CUDA), ``inline-eager`` (the eager PyTorch composition: the authors' order of
operations), ``linear``, ``softmax`` (fused SDPA: flash / memory-efficient on CUDA) and
``softmax-math`` (explicit N x N softmax, as the authors' code computes it) are the default
(:data:`DEFAULT_LAYER_KINDS`); the other linear attentions the paper compares against (``hydra``,
``efficient``, ``angular``, ``relu_msa``, ``focused``) can be named too. A ``+compile`` suffix
times the layer under ``torch.compile``.
Achieved GFLOP/s use the analytic counts of :mod:`.flops` (for the other linear attentions, the
count of ``FlopCounterMode`` over one forward at the case's shape); the machine's float32 matmul rate,
measured in the same run, gives each case's arithmetic floor. Batches hold a constant token
budget (``batch = tokens // (H*W)``) unless a batch is fixed, so every size does comparable work.
"""

from __future__ import annotations

import math
import pathlib
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..runtime.compile import compile_module
from ..runtime.graphs import compile_mode_for
from ..layers import build_attention
from ..layers.linear_family import LINEAR_CORES
from .flops import attention_layer_flops, counted_layer_flops
from ..runtime.amp import amp_dtype
from ..runtime.progress import progress_bar
from .sweep import (
    Measured,
    PointTiming,
    check_positive,
    check_stem,
    dtype_name,
    measure_point,
    resolve_device,
    resolve_dtype,
    run_context,
)
from .timing import failure_status, measure_matmul_rate, time_interleaved

__all__ = [
    "DEFAULT_LAYER_KINDS",
    "LAYER_COLUMNS",
    "LAYER_KINDS",
    "RESIDUAL_COLUMNS",
    "bench_attention",
    "bench_residual",
    "parse_layer_kind",
    "run_attention_bench",
    "run_residual_bench",
]

MODES = ("fwd", "fwd+bwd")

LAYER_COLUMNS = (
    ("grid", "grid", ""),
    ("batch", "B", ""),
    ("mode", "mode", ""),
    ("kind", "layer", ""),
    ("median_ms", "median ms", ".3f"),
    ("speedup_vs_softmax", "vs softmax", ".2f"),
    ("gflop", "GFLOP", ".3f"),
    ("achieved_gflops", "GFLOP/s", ".1f"),
    ("pct_of_matmul", "% matmul", ".1f"),
    ("floor_ms", "floor ms", ".3f"),
    ("peak_mib", "peak MiB", ".1f"),
    ("status", "status", ""),
)


DEFAULT_LAYER_KINDS = ("inline", "inline-eager", "linear", "softmax", "softmax-math")
# softmax-flash / softmax-cudnn: SDPA held to one backend (an error where it cannot run)
LAYER_KINDS = DEFAULT_LAYER_KINDS + ("softmax-flash", "softmax-cudnn") + tuple(LINEAR_CORES)
ANALYTIC_KINDS = ("inline", "linear", "softmax")


def parse_layer_kind(spec: str) -> tuple[str, str, bool]:
    """``kind[-eager|-math][+compile]`` -> (attention kind, variant, compiled); kind in :data:`LAYER_KINDS`."""
    base, plus, suffix = spec.partition("+")
    if plus and suffix != "compile":
        raise ValueError(f"unknown layer kind {spec!r}: the only suffix is '+compile'")
    if base not in LAYER_KINDS:
        raise ValueError(f"unknown layer kind {spec!r}: expected one of {LAYER_KINDS}, optionally with '+compile'")
    kind, _, variant = base.partition("-")
    return kind, variant, bool(plus)


def layer_step(module, x, feat, mode, variant: str = "", amp: Optional[torch.dtype] = None):
    """One timed call of an attention layer on ``x: [B, N, C]`` over the grid ``feat``: a closure that
    runs the forward (``mode="fwd"``, no grad) or the forward and backward, under ``variant`` and ``amp``.

    Variants: eager: InLine without the fused kernels; math: SDPA's explicit N x N softmax; flash /
    cudnn: SDPA held to that backend."""

    def ctx():
        impl = "eager" if variant == "eager" else None
        return run_context(x.device.type, impl=impl, sdpa=variant or None, amp=amp)

    if mode == "fwd":

        def step():
            with torch.no_grad(), ctx():
                return module(x, feat)

        return step
    g = torch.ones(x.shape, dtype=x.dtype, device=x.device)

    def step():
        x.grad = None
        module.zero_grad(set_to_none=True)
        with ctx():
            out = module(x, feat)
        out.backward(g.to(out.dtype))

    return step


def _plan_kinds(
    sizes: Sequence[int], kinds: Sequence[str], compile: bool, modes: Sequence[str], dim: int, heads: int
) -> dict[str, tuple[str, str, bool]]:
    """Check a sweep's arguments -> kind -> :func:`parse_layer_kind` of it (with ``+compile`` where
    ``compile`` asks for it), in the order given."""
    kinds = [k if not compile or k.endswith("+compile") else f"{k}+compile" for k in kinds]
    parsed = {k: parse_layer_kind(k) for k in kinds}
    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}: expected one of {MODES}")
    for s in sizes:
        if int(s) <= 0:
            raise ValueError(f"grid sizes must be positive, got {s}")
    if dim <= 0 or heads <= 0 or dim % heads:
        raise ValueError(f"dim={dim} must be a positive multiple of heads={heads}")
    return parsed


@dataclass(frozen=True)
class _LayerSweep:
    """What every grid of a ``bench_attention`` sweep shares."""

    kinds: dict  # kind -> parse_layer_kind(kind): (attention kind, variant, compiled)
    modes: Sequence[str]
    dim: int
    heads: int
    device: torch.device
    dtype: torch.dtype
    amp: Optional[torch.dtype]
    compile_mode: str

    def cases(self, side: int, batch: int) -> tuple[dict, dict, dict]:
        """Build every layer kind for the grid ``side x side`` -> (steps, failures, forward FLOPs per kind);
        steps and failures are keyed by (kind, mode)."""
        n, feat = side * side, (side, side)
        steps, failures, flops_fwd = {}, {}, {}
        for kind, (base, variant, compiled) in self.kinds.items():
            try:
                module = build_attention(base, self.dim, self.heads).to(self.device, self.dtype)
                if compiled:
                    module = compile_module(module, self.compile_mode)
                x = torch.randn(
                    batch, n, self.dim, device=self.device, dtype=self.dtype, requires_grad="fwd+bwd" in self.modes
                )
            except Exception as err:  # noqa: BLE001 - an impossible case is reported, not fatal
                failures.update({(kind, mode): failure_status(err) for mode in self.modes})
                continue
            module.eval()  # no dropout in these layers: eval and train compute the same
            if base in ANALYTIC_KINDS:
                flops_fwd[kind] = attention_layer_flops(base, batch, n, self.dim, self.heads)
            else:
                flops_fwd[kind] = counted_layer_flops(module, x.detach(), feat)
            for mode in self.modes:
                steps[(kind, mode)] = layer_step(module, x, feat, mode, variant, self.amp)
        return steps, failures, flops_fwd

    def row(self, side: int, batch: int, kind: str, mode: str, m: Measured, flops_fwd: float, rate: float) -> dict:
        """The result row of one case; ``flops_fwd``: its forward FLOPs, ``rate``: the matmul FLOP/s."""
        flops = flops_fwd * (1 if mode == "fwd" else 3)
        return {
            "grid": f"{side}x{side}",
            "side": side,
            "tokens": side * side,
            "batch": batch,
            "dim": self.dim,
            "heads": self.heads,
            "dtype": dtype_name(self.dtype),
            "kind": kind,
            "mode": mode,
            "series": f"{kind} {mode}",
            "median_ms": m.median * 1e3,
            "min_ms": m.minimum * 1e3,
            "repeats": m.repeats,
            "gflop": flops / 1e9,
            "achieved_gflops": flops / m.median / 1e9,
            "pct_of_matmul": 100 * flops / m.median / rate,
            "floor_ms": flops / rate * 1e3,
            "peak_mib": m.peak / 2**20,
            "status": m.status,
        }

    def measure(self, side: int, batch: int, rate: float, timing: PointTiming) -> tuple[list[dict], Optional[str]]:
        """Time every case of one grid -> (its rows, why not graphed)."""
        steps, failures, flops_fwd = self.cases(side, batch)
        compiled = tuple(key for key in steps if self.kinds[key[0]][2])
        _, measured, why_not = measure_point(steps, failures, timing, device=self.device, compiled=compiled)
        rows = [
            self.row(side, batch, kind, mode, measured[(kind, mode)], flops_fwd.get(kind, math.nan), rate)
            for kind in self.kinds
            for mode in self.modes
        ]
        return rows, why_not


def _add_softmax_speedups(rows: list[dict], kinds: Sequence[str]) -> None:
    """``speedup_vs_softmax``: softmax time / this layer's time, same grid and mode, within one run."""
    for r in rows:
        # the fused-SDPA softmax layer, compiled when this row's layer is compiled (if timed)
        ref_kind = "softmax+compile" if r["kind"].endswith("+compile") and "softmax+compile" in kinds else "softmax"
        ref = next(
            (q for q in rows if q["kind"] == ref_kind and q["grid"] == r["grid"] and q["mode"] == r["mode"]), None
        )
        r["speedup_vs_softmax"] = ref["median_ms"] / r["median_ms"] if ref else math.nan


def _measure_grids(
    sweep: _LayerSweep, sizes: Sequence[int], batch: Optional[int], token_budget: int, rate: float, timing: PointTiming
) -> tuple[list[dict], Optional[str]]:
    """Every grid of the sweep in turn -> (rows with their speedups over softmax, why the last grid's
    steps were not graphed). The batch holds ``token_budget`` tokens unless ``batch`` is fixed."""
    rows, why_not = [], None
    for s in progress_bar(sizes, desc="grids", unit="grid"):
        b = batch if batch is not None else max(1, token_budget // (s * s))
        grid_rows, why_not = sweep.measure(s, b, rate, timing)
        rows += grid_rows
    _add_softmax_speedups(rows, list(sweep.kinds))
    return rows, why_not


def _announce(grids: int, kinds: int, modes: int, budget_s: Optional[float]) -> None:
    """One line on stderr before a sweep: its cases and how long their timed rounds may take."""
    cases = grids * kinds * modes
    bound = (
        f"; rounds stop after {budget_s:g} s a case (about {cases * budget_s / 60:.1f} min in all)" if budget_s else ""
    )
    print(
        f"bench attention: {cases} cases ({grids} grids x {kinds} kinds x {modes} modes){bound}",
        file=sys.stderr,
        flush=True,
    )


#: the sweep's grid sides, rounds and budget per case by default
SWEEP = {"sizes": (14, 28, 56, 112), "repeats": 7, "budget_s": 20.0}
#: ``--quick``: three small grids, few rounds, a short budget per case
QUICK = {"sizes": (7, 14, 28), "repeats": 3, "budget_s": 2.0}


def bench_attention(
    sizes: Sequence[int] = SWEEP["sizes"],
    kinds: Sequence[str] = DEFAULT_LAYER_KINDS,
    *,
    dim: int = 96,
    heads: int = 3,
    batch: Optional[int] = None,
    token_budget: int = 8 * 56 * 56,
    modes: Sequence[str] = MODES,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    warmup: int = 1,
    repeats: int = SWEEP["repeats"],
    budget_s: Optional[float] = SWEEP["budget_s"],
    memory: bool = True,
    compile: bool = False,
    compile_mode: str = "default",
    amp: Optional[str] = None,
    cuda_graphs: bool = False,
    seed: int = 0,
    quick: bool = False,
) -> dict:
    """Time the attention layers; returns ``{"meta": ..., "rows": [...]}`` (one row per case).

    Args:
        sizes: grid sides S (S x S tokens).
        kinds: layer kinds (see the module docstring), built by
            :func:`inline_attn.layers.build_attention`.
        dim, heads: channels C and heads h.
        batch: fixed batch; None = ``max(1, token_budget // S^2)``.
        modes: "fwd" and/or "fwd+bwd".
        dtype: parameters and inputs (float32, bfloat16, float16).
        warmup, repeats, budget_s: see :func:`inline_attn.bench.timing.time_interleaved`.
        memory: measure each case's peak memory (one extra untimed call).
        compile: ``torch.compile`` every layer (as a ``+compile`` suffix on each kind).
        compile_mode: the mode of every compiled layer (:data:`inline_attn.runtime.compile.COMPILE_MODES`;
            "reduce-overhead": CUDA graphs).
        amp: "bf16" / "fp16": run the layers under autocast (float32 parameters and inputs).
        cuda_graphs: capture every step in a CUDA graph and time its replay
            (:func:`inline_attn.runtime.graphs.graph_steps`); compiled layers take
            ``mode="reduce-overhead"`` instead. Where steps cannot be captured (the CPU) they run
            ungraphed and ``meta["why_not_graphed"]`` says why.
        quick: :data:`QUICK` instead of ``sizes``, ``repeats`` and ``budget_s`` (a first look).
    """
    if quick:
        sizes, repeats, budget_s = QUICK["sizes"], QUICK["repeats"], QUICK["budget_s"]
    autocast = amp_dtype(amp)
    compile_mode = compile_mode_for(compile_mode, cuda_graphs)
    parsed = _plan_kinds(sizes, kinds, compile, modes, dim, heads)
    check_positive("--batch", batch)
    check_positive("--tokens", token_budget)
    dt, dev = resolve_dtype(dtype), resolve_device(device)
    sweep = _LayerSweep(parsed, modes, dim, heads, dev, dt, autocast, compile_mode)
    timing = PointTiming(warmup, repeats, budget_s, memory, cuda_graphs)
    torch.manual_seed(seed)
    rate = measure_matmul_rate(dtype=autocast or dt, device=dev)
    _announce(len(sizes), len(parsed), len(modes), budget_s)
    rows, why_not = _measure_grids(sweep, sizes, batch, token_budget, rate, timing)
    return {
        "meta": {
            "bench": "attention",
            "matmul_gflops": rate / 1e9,
            "dim": dim,
            "heads": heads,
            "token_budget": None if batch is not None else token_budget,
            "batch": batch,
            "dtype": dtype_name(dt),
            "warmup": warmup,
            "repeats": repeats,
            "budget_s": budget_s,
            "compile": compile,
            "compile_mode": compile_mode,
            "amp": amp or "none",
            "cuda_graphs": cuda_graphs,
            "why_not_graphed": why_not,
            "device": str(dev),
        },
        "rows": rows,
    }


RESIDUAL_COLUMNS = (
    ("shape", "B x C x H x W", ""),
    ("mode", "mode", ""),
    ("shift_ms", "9 shifts ms", ".3f"),
    ("conv_ms", "grouped conv ms", ".3f"),
    ("speedup", "conv speedup", ".2f"),
)


def bench_residual(
    shapes: Sequence[tuple[int, int, int, int]] = (
        (128, 96, 14, 14),
        (512, 96, 7, 7),
        (8, 96, 56, 56),
        (2, 96, 112, 112),
    ),
    *,
    warmup: int = 1,
    repeats: int = 9,
    budget_s: Optional[float] = 10.0,
) -> dict:
    """The local residual two ways, interleaved: nine shifted multiply-adds
    (``ops.naive_local_residual``, the equation's form) vs one grouped convolution
    (``ops.local_residual``, the fast path), on V laid out as the layers give it (a
    channels-last view into the qkv output) and with the result consumed in token order;
    forward and forward + backward."""
    from ..ops import local_residual, naive_local_residual

    rows = []
    for b, c, h, w in shapes:
        qkv = torch.randn(b, h * w, 3 * c, requires_grad=True)
        wts = torch.randn(b, c, 3, 3, requires_grad=True)

        def step(fn, grad):
            def run():
                v = qkv[:, :, 2 * c :].reshape(b, h, w, c).permute(0, 3, 1, 2)
                out = fn(v, wts).flatten(2).transpose(1, 2)  # [B, HW, C], as the layer adds it
                if grad:
                    out.sum().backward()
                    qkv.grad = wts.grad = None

            return run

        for mode in ("fwd", "fwd+bwd"):
            g = mode != "fwd"
            t = time_interleaved(
                {"shift": step(naive_local_residual, g), "conv": step(local_residual, g)},
                warmup=warmup,
                repeats=repeats,
                budget_s=budget_s,
            )
            rows.append(
                {
                    "shape": f"{b}x{c}x{h}x{w}",
                    "mode": mode,
                    "shift_ms": t["shift"].median * 1e3,
                    "conv_ms": t["conv"].median * 1e3,
                    "speedup": t["shift"].median / t["conv"].median,
                }
            )
    return {"meta": {"bench": "residual", "repeats": repeats}, "rows": rows}


def run_attention_bench(
    out, name: str = "attention", *, plot: bool = True, **options
) -> tuple[dict, dict[str, pathlib.Path]]:
    """:func:`bench_attention` with ``options``, saved under ``out`` as ``<name>.json``, ``.csv`` and
    (with ``plot``) a ``.png`` of latency, speedup over softmax and peak memory per grid side;
    returns (result, paths)."""
    from .report import save_result, threads_label

    check_stem(name)
    result = bench_attention(**options)
    meta, device = result["meta"], options.get("device", "cpu")
    batch = meta["batch"] or f"{meta['token_budget']} tokens / S^2"
    title = (
        f"attention layers, C={meta['dim']}, {meta['heads']} heads, {meta['dtype']}, "
        f"batch = {batch}, {device}, {threads_label()}"
    )
    panels = (
        ("median_ms", "latency per batch (ms)", True),
        ("speedup_vs_softmax", "speedup vs softmax", False),
        ("peak_mib", "peak memory (MiB)", True),
    )
    sides = sorted({r["side"] for r in result["rows"]})
    kw = dict(x="side", series="series", xlabel="token grid side S (S x S tokens)", title=title, xticks=sides)
    paths = save_result(result, out, name, device=device, plot={**kw, "panels": panels} if plot else None)
    return result, paths


def run_residual_bench(
    out,
    name: str = "residual",
    *,
    dtype="float32",
    device="cpu",
    amp=None,
    compile_mode: str = "default",
    cuda_graphs: bool = False,
    memory: bool = True,
    **options,
) -> tuple[dict, dict[str, pathlib.Path]]:
    """:func:`bench_residual` with ``options``, saved under ``out`` as ``<name>.json`` and ``.csv``;
    returns (result, paths). It measures float32 on the CPU, eagerly, and no memory: another
    ``dtype`` or ``device``, an ``amp``, a compile mode or CUDA graphs are refused (not silently
    measured as eager float32 on the CPU)."""
    from .report import save_result

    check_stem(name)
    asked = (("--dtype", dtype, dtype == "float32"), ("--device", device, device == "cpu"))
    asked += (("--amp", amp, amp_dtype(amp) is None), ("--compile-mode", compile_mode, compile_mode == "default"))
    for flag, value, taken in (*asked, ("--cuda-graphs", cuda_graphs, not cuda_graphs)):
        if not taken:
            raise ValueError(f"{flag} {value!r}: bench residual measures eager float32 on the CPU only")
    result = bench_residual(**options)
    return result, save_result(result, out, name, device="cpu")
