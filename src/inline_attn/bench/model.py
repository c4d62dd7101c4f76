"""``bench model``: throughput, latency, peak memory and MACs of registered models.

Cases that share a sweep point (a resolution, a window size) are timed alternately in one
interleaved run after a warm-up; medians of the repeats; the device is synchronised around every
call. A case that runs out of memory (or cannot be built at that size) is recorded with ``nan``
and its status instead of stopping the sweep. The presets reproduce the paper's Fig. 6 sweeps.
"""

from __future__ import annotations

import ast
import gc
import math
import pathlib
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..runtime.compile import compile_module
from ..runtime.graphs import compile_mode_for
from ..models.swin import SOFTMAX_WINDOW_DIVISOR
from .breakdown import BREAKDOWN_CATEGORIES, profile_breakdown
from ..runtime.amp import amp_dtype
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
from .timing import failure_status, measure_matmul_rate

__all__ = [
    "BREAKDOWN_COLUMNS",
    "MODEL_COLUMNS",
    "ModelCase",
    "PRESETS",
    "bench_models",
    "parse_model_spec",
    "preset_cases",
    "run_model_bench",
]

MODEL_COLUMNS = (
    ("x", "x", ""),
    ("label", "model", ""),
    ("resolution", "res", ""),
    ("batch", "B", ""),
    ("mode", "mode", ""),
    ("throughput", "img/s", ".2f"),
    ("latency_ms", "latency ms", ".1f"),
    ("speedup", "speedup", ".2f"),
    ("gmacs", "GMACs/img", ".2f"),
    ("gflops", "GFLOP/s", ".1f"),
    ("pct_matmul", "% matmul", ".1f"),
    ("peak_mib", "peak MiB", ".1f"),
    ("status", "status", ""),
)
# --breakdown: profiled ms per category of a step (mean of 3), and the Amdahl bound on the speedup
BREAKDOWN_COLUMNS = (
    (("x", "x", ""), ("label", "model", ""))
    + tuple((f"bd_{c.replace(' ', '_')}", f"{c} ms", ".1f") for c in BREAKDOWN_CATEGORIES)
    + (("core_share", "core %", ".1f"), ("bound", "bound x", ".2f"))
)


@dataclass
class ModelCase:
    """One model at one sweep point.

    Attributes:
        label: the series name in tables and plots ("InLine-DeiT-T").
        name: registered model name, or a zero-argument factory (tests use tiny modules).
        resolution: input side (square images).
        x: the sweep value this case is plotted at (the resolution, or a window size).
        overrides: constructor keyword arguments (``img_size`` is set to ``resolution``
            unless given); three keys are not: ``impl`` runs the case with that InLine
            implementation (``impl=eager``: without the fused kernels, to compare both in one run),
            ``compile=1`` times the model under ``torch.compile`` and ``sdpa=math`` computes its
            softmax attention explicitly (as the authors' code does).
    """

    label: str
    name: Union[str, Callable[[], nn.Module]]
    resolution: int
    x: Union[int, float, None] = None
    overrides: dict = field(default_factory=dict)

    def build(self) -> nn.Module:
        if callable(self.name):
            return self.name()
        from ..models import create_model

        kw = {k: v for k, v in self.overrides.items() if k not in _RUN_KEYS}
        kw.setdefault("img_size", self.resolution)
        return create_model(self.name, **kw)

    @property
    def impl(self) -> Optional[str]:
        return self.overrides.get("impl")

    @property
    def compile(self) -> bool:
        return bool(self.overrides.get("compile", False))


_RUN_KEYS = ("impl", "compile", "sdpa")  # case options that are not constructor arguments


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_model_spec(spec: str) -> tuple[str, str, dict]:
    """``[label=]name[:key=value,key=value]`` -> (label, name, overrides).

    Values are Python literals where they parse (``num_heads=3``, ``window_size=7``), else
    strings (``pattern=S``). Without a label the spec itself labels the series.
    """
    head, _, tail = spec.partition(":")
    label, eq, name = head.partition("=")
    if not eq:
        label, name = spec, head
    overrides = {}
    for item in filter(None, tail.split(",")):
        key, eq, val = item.partition("=")
        if not eq or not key:
            raise ValueError(f"bad override {item!r} in model spec {spec!r}: expected key=value")
        overrides[key.strip()] = _literal(val.strip())
    if not name:
        raise ValueError(f"model spec {spec!r} names no model: expected [label=]name[:key=value,...]")
    return label, name, overrides


PRESETS = ("window", "resolution", "layer")


def preset_cases(preset: str, values: Optional[Sequence[int]] = None) -> tuple[list[ModelCase], str]:
    """The paper's Fig. 6 sweeps as cases; returns (cases, x-axis label).

    window: Swin-T vs InLine-Swin-T at 224 for windows 7/14/28/56. Swin-T is
        ``inline_swin_tiny`` with pattern "SSSS"; its softmax blocks use window
        ``max(7, window_size // SOFTMAX_WINDOW_DIVISOR)`` (``models.swin.softmax_window``), so
        ``window_size = SOFTMAX_WINDOW_DIVISOR * w`` gives softmax windows w (w >= 7).
        InLine-Swin-T keeps its pattern "IIIS" with ``window_size = w`` for the InLine blocks.
    resolution: DeiT-T (``inline_deit_tiny`` with pattern "S", 3 heads, as DeiT-T) vs
        InLine-DeiT-T (6 heads, as published) at 224/384/640/1024.
    """
    if preset == "window":
        cases = []
        for w in values or (7, 14, 28, 56):
            softmax = dict(pattern="SSSS", window_size=SOFTMAX_WINDOW_DIVISOR * w)
            cases.append(ModelCase("Swin-T", "inline_swin_tiny", 224, w, softmax))
            cases.append(ModelCase("InLine-Swin-T", "inline_swin_tiny", 224, w, dict(window_size=w)))
        return cases, "window size"
    if preset == "resolution":
        cases = []
        for r in values or (224, 384, 640, 1024):
            cases.append(ModelCase("DeiT-T", "inline_deit_tiny", r, r, dict(pattern="S", num_heads=3)))
            cases.append(ModelCase("InLine-DeiT-T", "inline_deit_tiny", r, r, {}))
        return cases, "resolution"
    raise ValueError(f"unknown model preset {preset!r}: expected window or resolution")


def _step(
    model: nn.Module,
    x: torch.Tensor,
    mode: str,
    sdpa: Optional[str],
    impl: Optional[str] = None,
    amp: Optional[torch.dtype] = None,
):
    """One timed step of ``model`` on the images ``x``: inference (no grad), or forward,
    cross-entropy and backward (``mode="train"``), under ``impl``, ``sdpa`` and ``amp``."""

    def ctx():
        return run_context(x.device.type, impl=impl, sdpa=sdpa, amp=amp)

    if mode == "infer":

        def step():
            with torch.no_grad(), ctx():
                return model(x)

        return step
    target = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)

    def step():
        model.zero_grad(set_to_none=True)
        with ctx():
            out = model(x)
        F.cross_entropy(out.float().flatten(1), target).backward()

    return step


def _macs(model: nn.Module, res: int, in_chans: int) -> float:
    from ..models.profile import profile

    return profile(model, (in_chans, res, res)).gmacs


def _check_run(mode: str, sdpa: Optional[str], batch: int) -> None:
    if mode not in ("infer", "train"):
        raise ValueError(f"unknown mode {mode!r}: expected infer or train")
    if sdpa not in (None, "math"):
        raise ValueError(f"unknown sdpa {sdpa!r}: expected None or 'math'")
    check_positive("--batch", batch)


def _by_point(cases: Sequence[ModelCase]) -> dict:
    """Sweep value (``x``, else the resolution) -> its cases, in the order given: each is timed together."""
    points = {}
    for c in cases:
        points.setdefault(c.x if c.x is not None else c.resolution, []).append(c)
    return points


def _keyed(group: Sequence[ModelCase]) -> list[tuple[str, ModelCase]]:
    """The cases of one sweep point with their keys (``"i:label"``: labels may repeat)."""
    return [(f"{i}:{c.label}", c) for i, c in enumerate(group)]


def _add_breakdown(row: dict, step: Callable[[], None]) -> None:
    """Profiled ms per operator category of ``step`` and the attention core's share, into ``row``."""
    bd = profile_breakdown(step)
    row.update({f"bd_{c.replace(' ', '_')}": ms for c, ms in bd.items()})
    row["core_share"] = 100 * bd["attention core"] / max(sum(bd.values()), 1e-9)


def _add_baseline_ratios(rows: list[dict], base: Optional[str]) -> None:
    """Speedup and memory ratio over the ``base`` label at the same x, and (after a breakdown) ``bound``:
    the baseline's latency over this case's latency without its attention core."""
    for r in rows:
        ref = next((q for q in rows if q["label"] == base and q["x"] == r["x"]), None)
        r["speedup"] = r["throughput"] / ref["throughput"] if ref else math.nan
        r["memory_ratio"] = r["peak_mib"] / ref["peak_mib"] if ref else math.nan
        if "core_share" in r:
            rest = r["latency_ms"] * (1 - r["core_share"] / 100)
            r["bound"] = ref["latency_ms"] / rest if ref and rest > 0 else math.nan


@dataclass(frozen=True)
class _ModelSweep:
    """What every sweep point of a ``bench_models`` run shares."""

    batch: int
    in_chans: int
    mode: str
    device: torch.device
    dtype: torch.dtype
    amp: Optional[torch.dtype]
    sdpa: Optional[str]
    channels_last: bool
    compile_mode: str
    macs: bool
    seed: int

    def build(self, case: ModelCase) -> tuple[nn.Module, Callable[[], None], float]:
        """The model of ``case`` on the device -> (model, its timed step, GMACs per image or nan)."""
        torch.manual_seed(self.seed)
        model = case.build().to(self.device, self.dtype)
        model.train(self.mode == "train")
        x = torch.randn(
            self.batch, self.in_chans, case.resolution, case.resolution, device=self.device, dtype=self.dtype
        )
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        runner = compile_module(model, self.compile_mode) if case.compile else model
        step = _step(runner, x, self.mode, case.overrides.get("sdpa", self.sdpa), impl=case.impl, amp=self.amp)
        gmacs = math.nan
        if self.macs:
            try:
                gmacs = _macs(model, case.resolution, self.in_chans)
            except Exception:  # noqa: BLE001 - MACs are extra information
                gmacs = math.nan
            model.train(self.mode == "train")
        return model, step, gmacs

    def cases(self, group: Sequence[ModelCase]) -> tuple[list[nn.Module], dict, dict, dict]:
        """Build one point's cases -> (models, steps, failures, GMACs), keyed ``"i:label"``."""
        models, steps, failures, gmacs = [], {}, {}, {}
        for key, case in _keyed(group):
            try:
                model, steps[key], gmacs[key] = self.build(case)
                models.append(model)
            except Exception as err:  # noqa: BLE001 - an impossible case is reported, not fatal
                failures[key] = failure_status(err)
        return models, steps, failures, gmacs

    def row(self, x, case: ModelCase, m: Measured, gmacs: float, rate: float) -> dict:
        """The result row of ``case`` at sweep value ``x``; ``rate``: the matmul FLOP/s."""
        row = {
            "x": x,
            "label": case.label,
            "model": case.name if isinstance(case.name, str) else getattr(case.name, "__name__", "factory"),
            "overrides": dict(case.overrides),
            "resolution": case.resolution,
            "batch": self.batch,
            "dtype": dtype_name(self.dtype),
            "mode": self.mode,
            "latency_ms": m.median * 1e3,
            "throughput": self.batch / m.median,
            "min_latency_ms": m.minimum * 1e3,
            "repeats": m.repeats,
            "gmacs": gmacs,
            "peak_mib": m.peak / 2**20,
            "status": m.status,
        }
        # forward MACs x 2 FLOPs; a training step counts forward + backward as 3 forwards
        row["gflops"] = row["gmacs"] * 2 * (3 if self.mode == "train" else 1) * row["throughput"]
        row["pct_matmul"] = 100 * row["gflops"] * 1e9 / rate
        return row

    def measure(self, x, group: Sequence[ModelCase], rate: float, timing: PointTiming, breakdown: bool):
        """Time the cases of the sweep point ``x`` -> (their rows, why not graphed); ``breakdown``:
        profile each timed step."""
        models, steps, failures, gmacs = self.cases(group)
        compiled = tuple(key for key, c in _keyed(group) if c.compile)
        steps, measured, why_not = measure_point(steps, failures, timing, device=self.device, compiled=compiled)
        rows = []
        for key, c in _keyed(group):
            rows.append(self.row(x, c, measured[key], gmacs.get(key, math.nan), rate))
            if breakdown and measured[key].timed:
                _add_breakdown(rows[-1], steps[key])
        del models, steps
        gc.collect()
        return rows, why_not


def bench_models(
    cases: Sequence[ModelCase],
    *,
    batch: int = 8,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    mode: str = "infer",
    warmup: int = 1,
    repeats: int = 5,
    budget_s: Optional[float] = 60.0,
    memory: bool = True,
    macs: bool = True,
    breakdown: bool = False,
    in_chans: int = 3,
    sdpa: Optional[str] = None,
    baseline: Optional[str] = None,
    amp: Optional[str] = None,
    channels_last: bool = False,
    compile_mode: str = "default",
    cuda_graphs: bool = False,
    seed: int = 0,
) -> dict:
    """Benchmark models; returns ``{"meta": ..., "rows": [...]}``, one row per case.

    Args:
        cases: :class:`ModelCase` list; cases with the same ``x`` are timed together, interleaved.
        batch: images per step. dtype: float32 / bfloat16 / float16 (weights and input).
        mode: "infer" (eval, no grad) or "train" (forward, cross-entropy, backward).
        warmup, repeats, budget_s: see :func:`inline_attn.bench.timing.time_interleaved`.
        memory: peak memory of one step (extra untimed call). macs: MACs per image
            (:func:`inline_attn.models.profile.profile`, batch 1, eval).
        breakdown: profile three extra steps per case (:mod:`.breakdown`): ms per operator category,
            the attention core's share, and ``bound``: the baseline's latency over this case's
            latency without its attention core, the most any attention core could give.
        sdpa: None (PyTorch's choice: fused kernels) or "math" (explicit N x N attention, as
            the reference code computes it).
        baseline: the label whose throughput the speedups divide by (default: first label).
        amp: "bf16" / "fp16": autocast around each step (weights and input stay in ``dtype``).
        channels_last: the input images (and the models' convolutions) in channels-last layout.
        compile_mode: the mode of the cases with ``compile=1`` (:data:`inline_attn.runtime.compile.COMPILE_MODES`).
        cuda_graphs: capture every step in a CUDA graph and time its replay
            (:func:`inline_attn.runtime.graphs.graph_steps`); compiled cases take
            ``mode="reduce-overhead"`` instead. Where steps cannot be captured (the CPU) they run
            ungraphed and ``meta["why_not_graphed"]`` says why.
    """
    autocast = amp_dtype(amp)
    _check_run(mode, sdpa, batch)
    compile_mode = compile_mode_for(compile_mode, cuda_graphs)
    dt, dev = resolve_dtype(dtype), resolve_device(device)
    sweep = _ModelSweep(batch, in_chans, mode, dev, dt, autocast, sdpa, channels_last, compile_mode, macs, seed)
    timing = PointTiming(warmup, repeats, budget_s, memory, cuda_graphs)
    base = baseline or next((c.label for c in cases), None)
    # achieved GFLOP/s against a large matmul measured in the same run: how far from the floor
    rate = measure_matmul_rate(dtype=dt, device=dev) if macs else math.nan
    rows, why_not = [], None
    for pt, group in _by_point(cases).items():
        point_rows, why_not = sweep.measure(pt, group, rate, timing, breakdown)
        rows += point_rows
    _add_baseline_ratios(rows, base)
    return {
        "meta": {
            "bench": "model",
            "batch": batch,
            "dtype": dtype_name(dt),
            "mode": mode,
            "warmup": warmup,
            "repeats": repeats,
            "budget_s": budget_s,
            "sdpa": sdpa or "default",
            "amp": amp or "none",
            "channels_last": channels_last,
            "compile_mode": compile_mode,
            "cuda_graphs": cuda_graphs,
            "why_not_graphed": why_not,
            "device": str(dev),
            "baseline": base,
            "matmul_gflops": rate / 1e9,
        },
        "rows": rows,
    }


def _check_spec(spec: str, name: str, overrides: dict) -> None:
    """A model spec's model and constructor arguments, checked before any timing (built on the meta
    device: no memory, no initialisation): a ValueError naming the spec."""
    from ..models import create_model

    try:
        with torch.device("meta"):
            create_model(name, **{k: v for k, v in overrides.items() if k not in _RUN_KEYS})
    except (TypeError, ValueError) as e:
        raise ValueError(f"model spec {spec!r}: {e}") from None


def _cases(models: Sequence[str], resolutions: Sequence[int], compile: bool) -> list[ModelCase]:
    """One case per model spec (``[label=]name[:key=value,...]``) and resolution."""
    if not models:
        raise ValueError("no models: give --models SPEC [SPEC ...] or --preset window|resolution")
    for r in resolutions:
        check_positive("--resolutions", r)
    cases = []
    for spec in models:
        label, model_name, overrides = parse_model_spec(spec)
        _check_spec(spec, model_name, overrides)
        if compile:
            overrides.setdefault("compile", 1)
        cases += [ModelCase(label, model_name, r, r, overrides) for r in resolutions]
    return cases


def run_model_bench(
    out,
    name: str = "model",
    *,
    models: Sequence[str] = (),
    resolutions: Sequence[int] = (224,),
    preset: Optional[str] = None,
    values: Optional[Sequence[int]] = None,
    compile: bool = False,
    batch: Optional[int] = None,
    mode: str = "infer",
    macs: bool = True,
    sdpa: Optional[str] = None,
    baseline: Optional[str] = None,
    breakdown: bool = False,
    channels_last: bool = False,
    plot: bool = True,
    **sweep,
) -> tuple[dict, dict[str, pathlib.Path]]:
    """``bench model``: the model specs at ``resolutions``, or a :data:`PRESETS` sweep (``layer``: the
    attention layers of :func:`~inline_attn.bench.attention.run_attention_bench`), saved under ``out``
    as ``<name>.json``, ``.csv`` and (with ``plot``) a ``.png`` of throughput, speedup and peak
    memory; a preset names the files after itself unless ``name`` is given. ``sweep``: the timing
    options both benchmarks share (dtype, device, amp, warmup, repeats, budget_s, memory,
    compile_mode, cuda_graphs). Returns (result, paths)."""
    from .report import save_result, threads_label

    check_stem(name)
    if preset == "layer":
        from .attention import DEFAULT_LAYER_KINDS, run_attention_bench

        layer = dict(sizes=(14, 28, 56, 112), kinds=DEFAULT_LAYER_KINDS, dim=96, heads=3, token_budget=8 * 56 * 56)
        stem = name if name != "model" else "layer"
        return run_attention_bench(
            out, stem, plot=plot, batch=batch, modes=("fwd", "fwd+bwd"), compile=compile, **layer, **sweep
        )
    if preset:
        if models:
            raise ValueError("give either --preset or --models, not both")
        cases, xlabel = preset_cases(preset, values)
        name = name if name != "model" else preset
        for c in cases if compile else ():
            c.overrides["compile"] = 1
    else:
        cases, xlabel = _cases(models, resolutions, compile), "resolution"
    batch = 8 if batch is None else batch
    options = dict(mode=mode, macs=macs, sdpa=sdpa, baseline=baseline, breakdown=breakdown, channels_last=channels_last)
    result = bench_models(cases, batch=batch, **options, **sweep)
    meta = result["meta"]
    meta["preset"] = preset
    title = (
        f"{meta['mode']}, batch {batch}, {meta['dtype']}, {sweep.get('device', 'cpu')}, "
        f"{threads_label()}, SDPA {meta['sdpa']}"
    )
    panels = (
        ("throughput", "throughput (img/s)", True),
        ("speedup", f"speedup vs {meta['baseline']}", False),
        ("peak_mib", "peak memory (MiB)", True),
    )
    xs = list(dict.fromkeys(r["x"] for r in result["rows"]))
    kw = dict(x="x", series="label", xlabel=xlabel, title=title, xticks=xs, panels=panels)
    return result, save_result(result, out, name, device=sweep.get("device", "cpu"), plot=kw if plot else None)
