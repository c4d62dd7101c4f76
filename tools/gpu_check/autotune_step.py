"""The ``autotune`` step (on demand: ``--steps autotune``): the Triton core's tile rows and warps
(:data:`TILINGS`) swept over :data:`SHAPES` (fwd+bwd, bf16). The winners per (GPU, token bucket,
head dim, heads, dtype), merged with the committed table, go to ``triton_tuning.json``: copy it to
``src/inline_attn/ops/fused/`` for later runs to read without re-tuning. Stops at the end of its
box; shapes not reached keep the committed entries."""

from __future__ import annotations

import json
import math

import torch

from .budget import StepContext

TILINGS = [(bn, w) for bn in (32, 64, 128) for w in (2, 4, 8)]
# (tokens per sample, head dim, heads, batch) as the paper's models run them: Swin / PVT windows with
# head dim 32, DeiT-T's 14 x 14 with 64, large grids
SHAPES = [(49, 32, 3, 4096), (196, 32, 3, 1024), (196, 64, 3, 256), (3136, 32, 3, 64), (3136, 64, 3, 16)]


def pick_winners(timings: dict, device_name: str, dtype: torch.dtype = torch.bfloat16) -> dict:
    """{(n, d, heads): {(BLOCK_N, warps): seconds, "default": seconds}} -> the tuning table's
    winners ``{key: {"BLOCK_N", "num_warps", "ms", "default_ms"}}`` (the fastest candidate; shapes
    with no timed candidate are left out)."""
    from inline_attn.ops.fused.triton import tuning_key

    winners = {}
    for (n, d, heads), by_tiling in timings.items():
        timed = {t: v for t, v in by_tiling.items() if t != "default" and math.isfinite(v)}
        if not timed:
            continue
        (block_n, warps), best = min(timed.items(), key=lambda kv: kv[1])
        winners[tuning_key(device_name, n, d, heads, dtype)] = {
            "BLOCK_N": block_n,
            "num_warps": warps,
            "ms": round(best * 1e3, 4),
            "default_ms": round(by_tiling.get("default", math.nan) * 1e3, 4),
        }
    return winners


def _sweep_shape(ctx: StepContext, n: int, d: int, heads: int, b: int) -> dict:
    """Seconds of one fwd+bwd at the default tiling and at each of :data:`TILINGS` (inf where the
    compiler refuses one), until the box ends."""
    from inline_attn.bench.timing import time_interleaved
    from inline_attn.ops.fused import triton as tc

    c, side = heads * d, int(math.isqrt(n))
    q, k, v = torch.randn(b, n, 3 * c, device="cuda", dtype=torch.bfloat16).chunk(3, dim=-1)
    w9 = torch.randn(b, 9, c, device="cuda", dtype=torch.float32)
    g = torch.randn(b, n, c, device="cuda", dtype=torch.bfloat16)
    args = (heads, d**-0.5, side, side, 0)

    def fwd_bwd():
        tc.inline_forward_triton(q, k, v, w9, *args)
        tc.inline_backward_triton(q, k, v, w9, g, *args)

    by_tiling = {"default": time_interleaved({"d": fwd_bwd}, warmup=2, repeats=5, device="cuda")["d"].median}
    for tiling in TILINGS:
        if ctx.seconds_left() <= 0:
            break
        try:
            with tc.forced_tiling(*tiling):
                by_tiling[tiling] = time_interleaved({"t": fwd_bwd}, warmup=2, repeats=5, device="cuda")["t"].median
        except Exception:  # noqa: BLE001 - a tiling the compiler refuses (registers, shared memory) loses
            by_tiling[tiling] = math.inf
    return by_tiling


def run(ctx: StepContext) -> dict:
    from inline_attn.ops.fused import triton as tc

    name = torch.cuda.get_device_name(0)
    timings = {}
    for n, d, heads, b in SHAPES[:2] if ctx.quick else SHAPES:
        if ctx.seconds_left() <= 0:
            break
        timings[(n, d, heads)] = _sweep_shape(ctx, n, d, heads, b)
        torch.cuda.empty_cache()
    winners = pick_winners(timings, name)
    committed = json.loads(tc.TUNING_FILE.read_text()) if tc.TUNING_FILE.is_file() else {"winners": {}}
    table = {**committed, "winners": {**committed.get("winners", {}), **winners}}
    (ctx.out / "triton_tuning.json").write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    gains = [f"{k.split('|', 1)[1]}: {w['default_ms'] / w['ms']:.2f}x" for k, w in winners.items() if w["ms"] > 0]
    return {
        "ok": bool(winners),
        "winners": winners,
        "summary": f"{len(winners)} of {len(SHAPES)} shapes tuned on {name} (triton_tuning.json; "
        f"gain over the defaults {', '.join(gains)})",
    }
