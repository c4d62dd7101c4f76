"""The ``autotune`` step (on demand: ``--steps autotune``): the Triton core's designs and their launch
parameters (:func:`candidates`: the fused tiles and warps, the resident launch's warps and, forward,
its taps one or three at a time, the streaming tiles and warps, less those that spill registers on
sm_90) swept over :data:`SHAPES`, bf16, the
forward and the backward timed apart. The winner of each direction per (GPU, token bucket, head
dim, heads, dtype), merged with the committed table, goes to ``triton_tuning.json``: copy it to
``src/inline_attn/ops/fused/`` for later runs to read without re-tuning. Stops at the end of its
box; shapes not reached keep the committed entries."""

from __future__ import annotations

import functools
import json
import math

import torch

from inline_attn.ops.fused.core_choice import CoreChoice, choices_entry, entry_choices

from .budget import StepContext

DTYPE = torch.bfloat16
TILINGS = [(bn, w) for bn in (32, 64, 128) for w in (2, 4, 8)]  # the fused design's (BLOCK_N, warps)
RESIDENT_WARPS = (2, 4, 8)
STREAM_TILINGS = [(bn, w) for bn in (16, 32, 64) for w in (2, 4, 8)]
# (tokens per sample, head dim, heads, batch) as the paper's models run them: Swin / PVT windows with
# head dim 32, 14 x 14 with 32 and 64, InLine-DeiT-T's layer (a class token, 6 heads of 32), large grids
SHAPES = [
    (49, 32, 3, 4096),
    (196, 32, 3, 1024),
    (197, 32, 6, 128),
    (196, 64, 3, 256),
    (3136, 32, 3, 64),
    (3136, 64, 3, 16),
]
DIRECTIONS = ("forward", "backward")
# Candidates dropped because a kernel they launch (forward or backward, the fused or the split
# launch) spills registers compiled for sm_90 (ptxas 12.8 through tools/kernel_audit.py, bf16, at
# SHAPES: ``triton_cache.autotune_launches(Compiler(registers=True))``, then each result's
# "spills"): (design, head-dim block, BLOCK_N, warps). The resident launch spills with fewer warps
# than its own rule gives (32 elements of a tile per thread: 8 warps at 256 x 32, 44 KB spilled
# forward at 2 warps, 40 bytes at 4), so its candidates start there.
SPILLING_SM90 = {
    ("fused", 32, 128, 2),
    ("fused", 64, 32, 2),
    ("fused", 64, 32, 4),
    ("fused", 64, 64, 2),
    ("fused", 64, 128, 2),
    ("fused", 64, 128, 4),
    ("stream", 32, 32, 2),
    ("stream", 64, 16, 2),
    ("stream", 64, 32, 2),
    ("stream", 64, 64, 2),
}


def candidates(n: int, d: int, backward: bool) -> list[CoreChoice]:
    """The choices timed at n tokens of head dim d in one direction: the fused tilings, the resident
    launch's warps (from its own rule's up) where the shape fits its tile, forward each with the
    residual's taps one at a time and three at a time (its rule picks by the tile; the trade of
    registers against memory round trips is the GPU's to measure), the streaming tilings where the
    head dim has a streaming tile; none of SPILLING_SM90."""
    from inline_attn.ops.fused import triton as tc

    out = [CoreChoice("fused", w, bn) for bn, w in TILINGS]
    if tc.design_fits("resident", n, d, DTYPE):
        least = tc.resident_warps(n, d)
        taps = (None,) if backward else (False, True)
        out += [CoreChoice("resident", w, serial_taps=t) for w in RESIDENT_WARPS if w >= least for t in taps]
    if tc.design_fits("stream", n, d, DTYPE):
        out += [CoreChoice("stream", w, bn) for bn, w in STREAM_TILINGS]
    block_d = max(16, 1 << (d - 1).bit_length())
    return [c for c in out if (c.design, block_d, c.block_n, c.num_warps) not in SPILLING_SM90]


def shape_args(n: int) -> tuple[int, int, int]:
    """(H, W, prefix tokens) of n tokens: the largest square grid and the rest as prefix tokens."""
    side = math.isqrt(n)
    return side, side, n - side * side


def pick_winners(timings: dict, device_name: str, dtype: torch.dtype = DTYPE) -> dict:
    """{(n, d, heads): {direction: {CoreChoice or "default": seconds}}} -> the tuning table's
    winners ``{key: entry}`` (:func:`~inline_attn.ops.fused.core_choice.choices_entry`): the fastest
    choice of each direction, picked apart, with the winners' milliseconds (``ms`` the two together)
    and the defaults' beside them (where they were timed). Shapes where a direction has no timed choice are left out."""
    from inline_attn.ops.fused.triton import tuning_key

    winners = {}
    for (n, d, heads), by_direction in timings.items():
        best, ms = {}, {}
        for direction in DIRECTIONS:
            timed = {c: v for c, v in by_direction.get(direction, {}).items() if c != "default" and math.isfinite(v)}
            if not timed:
                break
            best[direction], seconds = min(timed.items(), key=lambda kv: kv[1])
            ms[f"{direction}_ms"] = round(seconds * 1e3, 4)
            default = by_direction[direction].get("default", math.inf)
            if math.isfinite(default):  # JSON has no inf or nan
                ms[f"{direction}_default_ms"] = round(default * 1e3, 4)
        else:
            ms["ms"] = round(ms["forward_ms"] + ms["backward_ms"], 4)
            if all(f"{d}_default_ms" in ms for d in DIRECTIONS):
                ms["default_ms"] = round(ms["forward_default_ms"] + ms["backward_default_ms"], 4)
            winners[tuning_key(device_name, n, d, heads, dtype)] = choices_entry(
                best["forward"], best["backward"], **ms
            )
    return winners


def _forced(choice: CoreChoice, step) -> None:
    from inline_attn.ops.fused import triton as tc

    with tc.forced_core(choice):
        step()


def _launched(step) -> tuple:
    """What one call of ``step`` launches (kernels, grids, compile-time arguments); it runs, so its
    kernels compile (or load from the prebuilt cache) here, outside the timing."""
    from inline_attn.ops.fused import triton as tc

    with tc.record_launches() as log:
        step()
    return tuple((x.kernel, x.grid, tuple(sorted(x.meta.items()))) for x in log)


def _time_direction(ctx: StepContext, step, n: int, d: int, backward: bool) -> dict:
    """Seconds of ``step`` (the core's ``backward`` or forward) at the default choice and at each of
    :func:`candidates` (inf where it
    fails, e.g. a configuration the compiler refuses), timed interleaved; a candidate that launches
    what an earlier one did (a design that does not fit falls back) takes that one's time."""
    from inline_attn.bench.timing import time_interleaved

    cases, first_of = {"default": step}, {_launched(step): "default"}
    same, failed = {}, []
    for choice in candidates(n, d, backward):
        if ctx.seconds_left() <= 0:
            break
        run = functools.partial(_forced, choice, step)
        try:
            launches = _launched(run)
        except Exception:  # noqa: BLE001 - a configuration the compiler or the device refuses loses
            failed.append(choice)
            continue
        if launches in first_of:
            same[choice] = first_of[launches]
        else:
            first_of[launches] = choice
            cases[choice] = run
    labels = {str(c): c for c in cases}
    timed = time_interleaved({str(c): f for c, f in cases.items()}, warmup=2, repeats=5, device="cuda")
    seconds = {labels[label]: t.median if t.ok else math.inf for label, t in timed.items()}
    seconds.update({c: seconds[twin] for c, twin in same.items()})
    return {**seconds, **dict.fromkeys(failed, math.inf)}


def _sweep_shape(ctx: StepContext, n: int, d: int, heads: int, b: int) -> dict:
    """{direction: {choice: seconds}} of the core's forward and backward at one shape (bf16 q, k, v
    views of one projection, fp32 taps)."""
    from inline_attn.ops.fused import triton as tc

    c = heads * d
    q, k, v = torch.randn(b, n, 3 * c, device="cuda", dtype=DTYPE).chunk(3, dim=-1)
    w9 = torch.randn(b, 9, c, device="cuda", dtype=torch.float32)
    g = torch.randn(b, n, c, device="cuda", dtype=DTYPE)
    args = (heads, d**-0.5, *shape_args(n))
    steps = {
        "forward": lambda: tc.inline_forward_triton(q, k, v, w9, *args),
        "backward": lambda: tc.inline_backward_triton(q, k, v, w9, g, *args),
    }
    return {direction: _time_direction(ctx, step, n, d, direction == "backward") for direction, step in steps.items()}


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
    return {"ok": bool(winners), "winners": winners, "summary": _summary(winners, name)}


def _summary(winners: dict, device_name: str) -> str:
    """One line: the shapes tuned, each with its winners and its gain over the defaults."""
    rows = []
    for key, entry in winners.items():
        forward, backward = entry_choices(entry)
        gain = entry.get("default_ms", math.nan) / entry["ms"] if entry["ms"] > 0 else math.nan
        rows.append(f"{key.split('|', 1)[1]}: fwd {forward}, bwd {backward}, {gain:.2f}x the defaults")
    return f"{len(winners)} of {len(SHAPES)} shapes tuned on {device_name} (triton_tuning.json; {'; '.join(rows)})"
