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

import contextlib
import math
from typing import Optional, Sequence

import torch

from ..compile import compile_module
from ..cuda_graphs import compile_mode_for, graph_steps
from ..layers import build_attention
from ..layers.linear_family import LINEAR_CORES
from ..ops import use_impl
from .flops import attention_layer_flops, counted_layer_flops
from .timing import _failure, measure_matmul_rate, peak_memory, time_interleaved

__all__ = ["DEFAULT_LAYER_KINDS", "LAYER_COLUMNS", "LAYER_KINDS", "bench_attention", "parse_layer_kind"]

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


def _dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "float64": torch.float64,
    }
    if name not in table:
        raise ValueError(f"unknown dtype {name!r}: expected one of {sorted(table)}")
    return table[name]


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


SDPA_VARIANTS = {"math": "MATH", "flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


@contextlib.contextmanager
def _variant(variant: str):
    """eager: InLine without the fused kernels; math: SDPA's explicit N x N softmax; flash /
    cudnn: SDPA held to that backend."""
    with contextlib.ExitStack() as stack:
        if variant == "eager":
            stack.enter_context(use_impl("eager"))
        elif variant in SDPA_VARIANTS:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel(getattr(SDPBackend, SDPA_VARIANTS[variant])))
        yield


def layer_step(module, x, feat, mode, variant: str = "", amp: Optional[torch.dtype] = None):
    """One timed call of an attention layer on ``x: [B, N, C]`` over the grid ``feat``: a closure that
    runs the forward (``mode="fwd"``, no grad) or the forward and backward, under ``variant`` and ``amp``."""

    def ctx():
        stack = contextlib.ExitStack()
        stack.enter_context(_variant(variant))
        if amp is not None:
            stack.enter_context(torch.autocast(x.device.type, dtype=amp))
        return stack

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


def bench_attention(
    sizes: Sequence[int] = (14, 28, 56, 112),
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
    repeats: int = 7,
    budget_s: Optional[float] = 20.0,
    memory: bool = True,
    compile: bool = False,
    compile_mode: str = "default",
    amp: Optional[str] = None,
    cuda_graphs: bool = False,
    seed: int = 0,
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
        compile_mode: the mode of every compiled layer (:data:`inline_attn.compile.COMPILE_MODES`;
            "reduce-overhead": CUDA graphs).
        amp: "bf16" / "fp16": run the layers under autocast (float32 parameters and inputs).
        cuda_graphs: capture every step in a CUDA graph and time its replay
            (:func:`inline_attn.cuda_graphs.graph_steps`); compiled layers take
            ``mode="reduce-overhead"`` instead. Where steps cannot be captured (the CPU) they run
            ungraphed and ``meta["why_not_graphed"]`` says why.
    """
    amp_dtype = {None: None, "none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
    if amp not in amp_dtype:
        raise ValueError(f"unknown amp {amp!r}: expected none, bf16 or fp16")
    compile_mode = compile_mode_for(compile_mode, cuda_graphs)
    why_not = None
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
    dt = _dtype(dtype)
    dev = torch.device(device)
    torch.manual_seed(seed)
    rate = measure_matmul_rate(dtype=amp_dtype[amp] or dt, device=dev)
    rows = []
    for s in sizes:
        n = s * s
        b = batch if batch is not None else max(1, token_budget // n)
        feat = (s, s)
        cases, meta, flops_fwd = {}, {}, {}
        for kind in kinds:
            base, variant, compiled = parsed[kind]
            try:
                module = build_attention(base, dim, heads).to(dev, dt)
                if compiled:
                    module = compile_module(module, compile_mode)
                x = torch.randn(b, n, dim, device=dev, dtype=dt, requires_grad="fwd+bwd" in modes)
            except Exception as err:  # noqa: BLE001 - an impossible case is reported, not fatal
                for mode in modes:
                    meta[(kind, mode)] = _failure(err)
                continue
            module.eval()  # no dropout in these layers: eval and train compute the same
            if base in ANALYTIC_KINDS:
                flops_fwd[kind] = attention_layer_flops(base, b, n, dim, heads)
            else:
                flops_fwd[kind] = counted_layer_flops(module, x.detach(), feat)
            for mode in modes:
                cases[(kind, mode)] = layer_step(module, x, feat, mode, variant, amp_dtype[amp])
        if cuda_graphs:
            compiled_cases = tuple(key for key in cases if parsed[key[0]][2])
            cases, why_not = graph_steps(cases, dev, skip=compiled_cases)
        timings = time_interleaved(
            {f"{k}|{m}": fn for (k, m), fn in cases.items()},
            warmup=warmup,
            repeats=repeats,
            budget_s=budget_s,
            device=dev,
        )
        for kind in kinds:
            for mode in modes:
                t = timings.get(f"{kind}|{mode}")
                status = meta.get((kind, mode)) or (t.status if t else "error")
                flops = flops_fwd.get(kind, math.nan) * (1 if mode == "fwd" else 3)
                med = t.median if t is not None else math.nan
                peak = math.nan
                if memory and t is not None and t.ok:
                    peak, mstatus = peak_memory(cases[(kind, mode)], dev)
                    if mstatus != "ok":
                        status = mstatus
                rows.append(
                    {
                        "grid": f"{s}x{s}",
                        "side": s,
                        "tokens": n,
                        "batch": b,
                        "dim": dim,
                        "heads": heads,
                        "dtype": str(dt).replace("torch.", ""),
                        "kind": kind,
                        "mode": mode,
                        "series": f"{kind} {mode}",
                        "median_ms": med * 1e3,
                        "min_ms": (t.minimum if t is not None else math.nan) * 1e3,
                        "repeats": len(t.times) if t is not None else 0,
                        "gflop": flops / 1e9,
                        "achieved_gflops": flops / med / 1e9,
                        "pct_of_matmul": 100 * flops / med / rate,
                        "floor_ms": flops / rate * 1e3,
                        "peak_mib": peak / 2**20,
                        "status": status,
                    }
                )
    # ratios within one run: softmax time / this layer's time, same grid and mode
    for r in rows:
        # the fused-SDPA softmax layer, compiled when this row's layer is compiled (if timed)
        ref_kind = "softmax+compile" if r["kind"].endswith("+compile") and "softmax+compile" in kinds else "softmax"
        ref = next(
            (q for q in rows if q["kind"] == ref_kind and q["grid"] == r["grid"] and q["mode"] == r["mode"]), None
        )
        r["speedup_vs_softmax"] = ref["median_ms"] / r["median_ms"] if ref else math.nan
    return {
        "meta": {
            "bench": "attention",
            "matmul_gflops": rate / 1e9,
            "dim": dim,
            "heads": heads,
            "token_budget": None if batch is not None else token_budget,
            "batch": batch,
            "dtype": str(dt).replace("torch.", ""),
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
