"""``bench attention``: the InLine, linear and softmax layers side by side over token grids.

For each square grid (14x14 ... 112x112 tokens) every layer kind is timed in one interleaved
run: forward (eval, no grad) and forward + backward (gradients of the input and parameters).
Achieved GFLOP/s use the analytic counts of :mod:`.flops`; the machine's float32 matmul rate,
measured in the same run, gives each case's arithmetic floor. Batches hold a constant token
budget (``batch = tokens // (H*W)``) unless a batch is fixed, so every size does comparable work.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from ..layers import build_attention
from ..ops import use_cpu_kernel
from .flops import attention_layer_flops
from .timing import _failure, measure_matmul_rate, peak_memory, time_interleaved

__all__ = ["LAYER_COLUMNS", "bench_attention"]

MODES = ("fwd", "fwd+bwd")

LAYER_COLUMNS = (
    ("grid", "grid", ""), ("batch", "B", ""), ("mode", "mode", ""), ("kind", "layer", ""),
    ("median_ms", "median ms", ".3f"), ("speedup_vs_softmax", "vs softmax", ".2f"),
    ("gflop", "GFLOP", ".3f"), ("achieved_gflops", "GFLOP/s", ".1f"),
    ("pct_of_matmul", "% matmul", ".1f"), ("floor_ms", "floor ms", ".3f"),
    ("peak_mib", "peak MiB", ".1f"), ("status", "status", ""),
)


def _dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
             "float64": torch.float64}
    if name not in table:
        raise ValueError(f"unknown dtype {name!r}: expected one of {sorted(table)}")
    return table[name]


def _layer_step(module, x, feat, mode, fused=True):
    # fused=False: the InLine layer without the fused CPU kernel (the eager composition), to
    # show what the kernel buys in the same run
    if mode == "fwd":
        def step():
            with torch.no_grad(), use_cpu_kernel(fused):
                return module(x, feat)
        return step
    g = torch.ones(x.shape, dtype=x.dtype, device=x.device)

    def step():
        x.grad = None
        module.zero_grad(set_to_none=True)
        with use_cpu_kernel(fused):
            module(x, feat).backward(g)
    return step


LAYER_KINDS = ("inline", "inline-eager", "linear", "softmax")


def bench_attention(
    sizes: Sequence[int] = (14, 28, 56, 112),
    kinds: Sequence[str] = LAYER_KINDS,
    *,
    dim: int = 96,
    heads: int = 3,
    batch: Optional[int] = None,
    token_budget: int = 8 * 56 * 56,
    modes: Sequence[str] = MODES,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    warmup: int = 1,
    repeats: int = 7,
    budget_s: Optional[float] = 20.0,
    memory: bool = True,
    compile: bool = False,
    seed: int = 0,
) -> dict:
    """Time the attention layers; returns ``{"meta": ..., "rows": [...]}`` (one row per case).

    Args:
        sizes: grid sides S (S x S tokens).
        kinds: layer kinds, built by :func:`inline_attn.layers.build_attention`; ``inline-eager``
            is the InLine layer with the fused CPU kernel switched off.
        dim, heads: channels C and heads h.
        batch: fixed batch; None = ``max(1, token_budget // S^2)``.
        modes: "fwd" and/or "fwd+bwd".
        dtype: parameters and inputs (float32, bfloat16, float16).
        warmup, repeats, budget_s: see :func:`inline_attn.bench.timing.time_interleaved`.
        memory: measure each case's peak memory (one extra untimed call).
        compile: ``torch.compile`` each layer (timed after its compilation in the warm-up).
    """
    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}: expected one of {MODES}")
    for s in sizes:
        if int(s) <= 0:
            raise ValueError(f"grid sizes must be positive, got {s}")
    if dim <= 0 or heads <= 0 or dim % heads:
        raise ValueError(f"dim={dim} must be a positive multiple of heads={heads}")
    dt = _dtype(dtype)
    dev = torch.device(device)
    torch.manual_seed(seed)
    rate = measure_matmul_rate(dtype=torch.float32, device=dev)
    rows = []
    for s in sizes:
        n = s * s
        b = batch if batch is not None else max(1, token_budget // n)
        feat = (s, s)
        cases, meta = {}, {}
        for kind in kinds:
            try:
                module = build_attention(kind.removesuffix("-eager"), dim, heads).to(dev, dt)
                if compile:
                    module = torch.compile(module)
                x = torch.randn(b, n, dim, device=dev, dtype=dt, requires_grad="fwd+bwd" in modes)
            except Exception as err:  # noqa: BLE001 - an impossible case is reported, not fatal
                for mode in modes:
                    meta[(kind, mode)] = _failure(err)
                continue
            module.eval()  # no dropout in these layers: eval and train compute the same
            for mode in modes:
                cases[(kind, mode)] = _layer_step(module, x, feat, mode, fused=not kind.endswith("-eager"))
        timings = time_interleaved(
            {f"{k}|{m}": fn for (k, m), fn in cases.items()}, warmup=warmup, repeats=repeats,
            budget_s=budget_s, device=dev,
        )
        for kind in kinds:
            for mode in modes:
                t = timings.get(f"{kind}|{mode}")
                status = meta.get((kind, mode)) or (t.status if t else "error")
                flops = attention_layer_flops(kind.removesuffix("-eager"), b, n, dim, heads, backward=mode != "fwd")
                med = t.median if t is not None else math.nan
                peak = math.nan
                if memory and t is not None and t.ok:
                    peak, mstatus = peak_memory(cases[(kind, mode)], dev)
                    if mstatus != "ok":
                        status = mstatus
                rows.append({
                    "grid": f"{s}x{s}", "side": s, "tokens": n, "batch": b, "dim": dim, "heads": heads,
                    "dtype": str(dt).replace("torch.", ""), "kind": kind, "mode": mode, "series": f"{kind} {mode}",
                    "median_ms": med * 1e3, "min_ms": (t.minimum if t is not None else math.nan) * 1e3,
                    "repeats": len(t.times) if t is not None else 0,
                    "gflop": flops / 1e9, "achieved_gflops": flops / med / 1e9,
                    "pct_of_matmul": 100 * flops / med / rate, "floor_ms": flops / rate * 1e3,
                    "peak_mib": peak / 2 ** 20, "status": status,
                })
    # ratios within one run: softmax time / this layer's time, same grid and mode
    for r in rows:
        ref = next((q for q in rows if q["kind"] == "softmax" and q["grid"] == r["grid"]
                    and q["mode"] == r["mode"]), None)
        r["speedup_vs_softmax"] = ref["median_ms"] / r["median_ms"] if ref else math.nan
    return {
        "meta": {"bench": "attention", "matmul_gflops": rate / 1e9, "dim": dim, "heads": heads,
                 "token_budget": None if batch is not None else token_budget,
                 "batch": batch, "dtype": str(dt).replace("torch.", ""), "warmup": warmup,
                 "repeats": repeats, "budget_s": budget_s, "compile": compile},
        "rows": rows,
    }


RESIDUAL_COLUMNS = (
    ("shape", "B x C x H x W", ""), ("mode", "mode", ""), ("shift_ms", "9 shifts ms", ".3f"),
    ("conv_ms", "grouped conv ms", ".3f"), ("speedup", "conv speedup", ".2f"),
)


def bench_residual(
    shapes: Sequence[tuple[int, int, int, int]] = ((128, 96, 14, 14), (512, 96, 7, 7), (8, 96, 56, 56), (2, 96, 112, 112)),
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
                v = qkv[:, :, 2 * c:].reshape(b, h, w, c).permute(0, 3, 1, 2)
                out = fn(v, wts).flatten(2).transpose(1, 2)  # [B, HW, C], as the layer adds it
                if grad:
                    out.sum().backward()
                    qkv.grad = wts.grad = None
            return run
        for mode in ("fwd", "fwd+bwd"):
            g = mode != "fwd"
            t = time_interleaved({"shift": step(naive_local_residual, g), "conv": step(local_residual, g)},
                                 warmup=warmup, repeats=repeats, budget_s=budget_s)
            rows.append({"shape": f"{b}x{c}x{h}x{w}", "mode": mode, "shift_ms": t["shift"].median * 1e3,
                         "conv_ms": t["conv"].median * 1e3, "speedup": t["shift"].median / t["conv"].median})
    return {"meta": {"bench": "residual", "repeats": repeats}, "rows": rows}
