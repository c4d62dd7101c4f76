"""The ``goals`` step: the measurements behind the goal table (:mod:`.goals`), in order of
value, each a :class:`.budget.Part` within the step's box.

Every model ratio is InLine against the project's own softmax twin (:func:`inline_attn.bench.model.preset_cases`:
DeiT-T is ``inline_deit_tiny`` with pattern "S" and 3 heads, Swin-T ``inline_swin_tiny`` with
pattern "SSSS"), built in the same process and timed interleaved (:func:`inline_attn.bench.model.bench_models`),
training steps (forward, cross-entropy, backward; no optimizer) under bf16 autocast. The softmax
runs through SDPA with PyTorch's choice of backend; the backend that ran is named in the notes.
"""

from __future__ import annotations

import math
import time

import torch

from .budget import Part, StepContext, run_parts
from .core import core_shares
from .kernels import sdpa_backend

DEIT_BATCH, SWIN_BATCH = 128, 64
LAYER_TOKENS = 64 * 56 * 56  # a batch of 64 at 56x56, of 1024 at 14x14
HOST_GRID, HOST_CALLS, HOST_ROUNDS = (4, 4), 200, 7


def _timing(quick: bool, budget_s: float) -> dict:
    return dict(device="cuda", amp="bf16", warmup=3, repeats=3 if quick else 6, budget_s=budget_s, memory=False)


def _ratio(rows: list[dict], label: str, base: str, key: str = "throughput") -> tuple[float, str]:
    """``label``'s ``key`` over ``base``'s in ``rows`` -> (ratio or nan, why nan)."""
    a = next((r for r in rows if r["label"] == label), None)
    b = next((r for r in rows if r["label"] == base), None)
    for name, r in ((label, a), (base, b)):
        if r is None or r.get("status") != "ok" or not math.isfinite(r.get(key, math.nan)):
            return math.nan, f"{name}: {r.get('status') if r else 'not measured'}"
    return a[key] / b[key], ""


def _notes(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _graphed(value: float, graphed: bool, why: str | None) -> tuple[float, str]:
    """A graphed row's value, or nan where its steps could not all be captured (``why``): a
    graphed goal is not met by ungraphed steps."""
    if graphed and why:
        return math.nan, f"not graphed: {why}"
    return value, ""


def _model_backend(case, batch: int) -> str:
    """The SDPA backend one bf16 training step of ``case`` (a softmax twin) runs."""
    import torch.nn.functional as F

    model = case.build().cuda().train()
    x = torch.randn(batch, 3, case.resolution, case.resolution, device="cuda")
    target = torch.zeros(batch, dtype=torch.long, device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float(), target)
        loss.backward()

    step()  # compiled and warm before the profiled call
    return sdpa_backend(step)  # the model is freed with the step on return


def part_deit(ctx: StepContext) -> dict:
    """InLine-DeiT-T / DeiT-T at 224 px, B 128, eager and CUDA-graphed."""
    from inline_attn.bench.model import bench_models, preset_cases

    cases, _ = preset_cases("resolution", (224,))
    backend = _model_backend(next(c for c in cases if c.label == "DeiT-T"), DEIT_BATCH)
    values, notes, rows = {}, {}, []
    for graphed, key in ((False, "deit_eager"), (True, "deit_graphed")):
        res = bench_models(
            cases, batch=DEIT_BATCH, mode="train", macs=False, cuda_graphs=graphed, **_timing(ctx.quick, 1.5)
        )
        why = res["meta"]["why_not_graphed"]
        value, note = _ratio(res["rows"], "InLine-DeiT-T", "DeiT-T")
        values[key], graph_note = _graphed(value, graphed, why)
        notes[key] = _notes(f"SDPA backend {backend}", note, graph_note)
        rows += [{**r, "graphed": graphed and why is None} for r in res["rows"]]
    return {"values": values, "notes": notes, "rows": rows, "sdpa_backend": backend}


def _swin(ctx: StepContext, graphed: bool) -> dict:
    """InLine-Swin-T and Swin-T at windows 7 and 56, all four in one interleaved run, B 64, eager
    (the ``*_eager`` rows) or CUDA-graphed (the goal rows)."""
    from inline_attn.bench.model import ModelCase, bench_models, preset_cases

    preset, _ = preset_cases("window", (7, 56))
    cases = [ModelCase(f"{c.label} w{c.x}", c.name, c.resolution, "swin", c.overrides) for c in preset]
    backends = {w: _model_backend(next(c for c in cases if c.label == f"Swin-T w{w}"), SWIN_BATCH) for w in (7, 56)}
    timing = _timing(ctx.quick, 2.0 if not graphed else 1.5)
    res = bench_models(cases, batch=SWIN_BATCH, mode="train", macs=False, cuda_graphs=graphed, **timing)
    why = res["meta"]["why_not_graphed"] if graphed else None
    values, notes = {}, {}
    for key, label, base in (
        ("swin_published", "InLine-Swin-T w56", "Swin-T w7"),
        ("swin_w7", "InLine-Swin-T w7", "Swin-T w7"),
        ("swin_w56", "InLine-Swin-T w56", "Swin-T w56"),
    ):
        key = key if graphed else f"{key}_eager"
        value, note = _ratio(res["rows"], label, base)
        values[key], graph_note = _graphed(value, graphed, why)
        notes[key] = _notes(f"SDPA backend {backends[int(base.rsplit('w', 1)[1])]}", note, graph_note)
    rows = [{**r, "graphed": graphed and why is None} for r in res["rows"]]
    return {"values": values, "notes": notes, "rows": rows, "sdpa_backend": backends}


def part_swin(ctx: StepContext) -> dict:
    """The Swin rows eager (reported beside the graphed goals)."""
    return _swin(ctx, graphed=False)


def part_swin_graphed(ctx: StepContext) -> dict:
    """The Swin goal rows, CUDA-graphed."""
    return _swin(ctx, graphed=True)


def _layer_backend(side: int, batch: int) -> str:
    from inline_attn.bench.attention import layer_step
    from inline_attn.layers import build_attention

    layer = build_attention("softmax", 96, 3).cuda().eval()
    x = torch.randn(batch, side * side, 96, device="cuda", requires_grad=True)
    step = layer_step(layer, x, (side, side), "fwd+bwd", "", torch.bfloat16)
    step()
    return sdpa_backend(step)


# the layer part's runs: (graphed, the core kernels, the rows' key suffix); the streaming kernels
# (triton.core_kernels("stream")) graphed only, beside the graphed goal rows of the default ones
LAYER_RUNS = ((False, "resident", "eager"), (True, "resident", "graphed"), (True, "stream", "stream"))


def part_layer(ctx: StepContext) -> dict:
    """The InLine layer against the SDPA softmax layer, fwd+bwd (C 96, 3 heads), at 14x14 B 1024
    and 56x56 B 64: eager and CUDA-graphed, and graphed with the streaming kernels;
    each run the two layers interleaved."""
    from inline_attn.bench.attention import bench_attention
    from inline_attn.ops.fused import triton as tc

    backends = {side: _layer_backend(side, LAYER_TOKENS // side**2) for side in (14, 56)}
    values, notes, rows = {}, {}, []
    for graphed, kernels, suffix in LAYER_RUNS:
        with tc.core_kernels(kernels):  # the graphs capture the kernels chosen inside the block
            res = bench_attention(
                sizes=(14, 56),
                kinds=("inline", "softmax"),
                token_budget=LAYER_TOKENS,
                modes=("fwd+bwd",),
                cuda_graphs=graphed,
                **_timing(ctx.quick, 0.5),
            )
        why = res["meta"]["why_not_graphed"]
        for r in res["rows"]:
            r["graphed"], r["core_kernels"] = graphed and why is None, kernels
            if r["kind"] != "inline":
                continue
            key = f"layer{r['side']}_{suffix}"
            value = r["speedup_vs_softmax"] if r["status"] == "ok" else math.nan
            values[key], graph_note = _graphed(value, graphed, why)
            status = "" if r["status"] == "ok" else f"InLine layer: {r['status']}"
            notes[key] = _notes(f"SDPA backend {backends[r['side']]}", status, graph_note)
        rows += res["rows"]
    return {"values": values, "notes": notes, "rows": rows, "sdpa_backend": backends}


def part_core(ctx: StepContext) -> dict:
    """The Triton core's share of the copy rate at InLine-DeiT-T's layer and 7x7 ... 112x112: the
    default kernels, the streaming ones, SDPA's core and a copy, interleaved."""
    rows = core_shares()
    values = {f"core{r['key']}": r["pct_of_copy"] for r in rows}
    notes = {f"core{r['key']}": _core_note(r) for r in rows}
    return {"values": values, "notes": notes, "rows": rows}


def _core_note(row: dict) -> str:
    """'630 GB/s, B 64, inline_fwd_resident; streaming kernels (inline_fwd_stream) 6 %; SDPA's core 1.9x its time'."""
    return (
        f"{row['GBps']:.0f} GB/s, B {row['batch']}, {row['launch']}; streaming kernels ({row['stream_launch']}) "
        f"{row['stream_pct_of_copy']:.0f} %; SDPA's core {row['sdpa_ratio']:.2f}x its time"
    )


def part_deit1024(ctx: StepContext) -> dict:
    """InLine-DeiT-T / DeiT-T at 1024 px, B 64."""
    from inline_attn.bench.model import bench_models, preset_cases

    cases, _ = preset_cases("resolution", (1024,))
    res = bench_models(cases, batch=64, mode="train", macs=False, **_timing(ctx.quick, 2.0))
    value, note = _ratio(res["rows"], "InLine-DeiT-T", "DeiT-T")
    return {"values": {"deit1024": value}, "notes": {"deit1024": note}, "rows": res["rows"]}


def host_seconds(steps: dict, calls: int = HOST_CALLS, rounds: int = HOST_ROUNDS) -> dict[str, float]:
    """Host seconds per call of each step, rounds interleaved, the median: the wall clock of
    ``calls`` calls without synchronising inside them (the launches are asynchronous, and at a
    tiny shape the GPU keeps up), then a synchronisation outside the clock."""
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for label, step in steps.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                step()
            times[label].append((time.perf_counter() - t0) / calls)
            torch.cuda.synchronize()
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def part_host(ctx: StepContext) -> dict:
    """Host time of one layer fwd+bwd at a tiny shape (B 1, 4x4 tokens, C 96, 3 heads, float32),
    InLine against the SDPA softmax layer, on the GPU."""
    from inline_attn.bench.attention import layer_step
    from inline_attn.layers import build_attention

    steps = {}
    for kind in ("inline", "softmax"):
        layer = build_attention(kind, 96, 3).cuda().eval()
        x = torch.randn(1, HOST_GRID[0] * HOST_GRID[1], 96, device="cuda", requires_grad=True)
        steps[kind] = layer_step(layer, x, HOST_GRID, "fwd+bwd")
        for _ in range(20):  # compiled and warm
            steps[kind]()
    torch.cuda.synchronize()
    secs = host_seconds(steps, calls=50 if ctx.quick else HOST_CALLS)
    us = {k: v * 1e6 for k, v in secs.items()}
    note = f"{us['inline']:.0f} us against {us['softmax']:.0f} us a call"
    return {"values": {"host_ratio": us["inline"] / us["softmax"]}, "notes": {"host_ratio": note}, "rows": [us]}


# in order of value; usual seconds: the longer of two runs on an H200 (2026-11-26), rounded up
PARTS = (
    Part("deit", 10, part_deit),
    Part("swin-graphed", 20, part_swin_graphed),  # 8 s on the H200 (2026-11-28)
    Part("layer", 8, part_layer),  # 5 s measured for its three runs on the H200
    Part("core", 10, part_core),  # the default and streaming kernels, SDPA's core and a copy at five shapes: 2 s
    Part("deit1024", 10, part_deit1024),
    Part("host", 6, part_host),
    Part("swin", 25, part_swin),  # eager, reported beside the graphed goals: 7 s
)


def run(ctx: StepContext) -> dict:
    """Every part of :data:`PARTS` that fits the box, in order."""
    return run_parts(ctx, PARTS)
