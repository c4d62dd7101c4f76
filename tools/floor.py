"""The floor arithmetic of the goal table: what a training step, a layer or the InLine core
would cost on an H200 if every kernel ran at the device's byte or FLOP rate.

The device (:data:`H200`): 4.8 TB/s HBM3e peak, about 4.2 TB/s as a device-to-device copy measures
it (bytes read + written), about 990 TFLOP/s dense bf16. A part's floor is its bytes over the copy
rate or its FLOPs over the bf16 rate, whichever is longer; a step's floor adds its parts:

- **attention core** (:func:`core_bytes`, :func:`core_flops`), training (forward + backward), bf16:
  the forward reads Q, K, V and writes O, the backward reads Q, K, V, dO and writes dQ, dK, dV:
  11 B N C elements of 2 bytes, for InLine and for softmax's flash attention alike. InLine adds its
  residual's taps ([B, 9, C]: read forward, read and written backward) and does 7 d x d products
  per head (2 forward, 5 backward: 14 N d^2 FLOPs) plus 3 passes of 9 taps; flash attention does
  4 N^2 d FLOPs per head forward and about 2.5x that backward (3.5 x 4 N^2 d in all);
- **linear layers** (:func:`linear_flops`): a transformer block's qkv, proj and MLP (ratio 4) are
  12 C^2 multiply-adds per token forward, 3x that with the backward: 72 C^2 FLOPs per token;
  Swin's patch merging adds 8 C^2 per merged token of the stage before. Patch embeddings, norms,
  GELU and the other elementwise kernels are left out, so a real step's ceiling is lower than the
  ratio of floors suggests.

:func:`goal_rows` gives every row of the table with its goal, the floor and its arithmetic;
``python -m tools.floor`` prints it as Markdown (docs/benchmarks.md puts the values
measured on the H200 runs beside it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from inline_attn.runtime.report import markdown_table

__all__ = ["Attention", "Device", "H200", "attention_ms", "core_bytes", "core_flops", "goal_rows", "table"]

BF16 = 2  # bytes per element
ELEMENTS_MOVED = 11  # x B N C: Q, K, V, O forward; Q, K, V, dO, dQ, dK, dV backward
FLASH_BWD = 2.5  # flash attention's backward FLOPs over its forward's


@dataclass(frozen=True)
class Device:
    """A GPU's rates: ``hbm_Bps`` its memory's peak, ``copy_Bps`` a measured copy's (bytes read +
    written per second), ``bf16_flops`` dense bf16 FLOP/s."""

    name: str
    hbm_Bps: float
    copy_Bps: float
    bf16_flops: float


H200 = Device("H200", 4.8e12, 4.2e12, 990e12)


@dataclass(frozen=True)
class Attention:
    """The attention layers of one kind in a training step: ``layers`` layers, each over
    ``samples`` sequences (batch x windows) of ``tokens`` tokens, ``channels`` = heads x head dim;
    ``kind`` "inline" (with its residual) or "softmax" (flash attention)."""

    kind: str
    layers: int
    samples: int
    tokens: int
    channels: int
    heads: int

    @property
    def head_dim(self) -> int:
        return self.channels // self.heads


def core_bytes(a: Attention) -> float:
    """Bytes a training step's attention cores must move at least (bf16): 11 B N C elements, plus
    InLine's taps ([B, 9, C] read forward, read and written backward)."""
    per_layer = ELEMENTS_MOVED * a.samples * a.tokens * a.channels
    if a.kind == "inline":
        per_layer += 3 * 9 * a.samples * a.channels
    return float(per_layer * BF16 * a.layers)


def core_flops(a: Attention) -> float:
    """FLOPs of a training step's attention cores: flash attention's 3.5 x 4 N^2 d per head, or
    InLine's 7 d x d products (14 N d^2 per head) and 3 passes of its 9 taps."""
    n, d, per = a.tokens, a.head_dim, a.samples * a.heads * a.layers
    if a.kind == "softmax":
        return (1 + FLASH_BWD) * 4 * n * n * d * per
    return 14 * n * d * d * per + 3 * 2 * 9 * n * a.channels * a.samples * a.layers


def attention_ms(a: Attention, dev: Device = H200) -> float:
    """The cores' floor in ms: bytes over the copy rate or FLOPs over the bf16 rate, the longer."""
    return 1e3 * max(core_bytes(a) / dev.copy_Bps, core_flops(a) / dev.bf16_flops)


def linear_flops(tokens: int, channels: int, layers: int) -> float:
    """FLOPs of ``layers`` blocks' linear layers over ``tokens`` tokens in a training step: 72 C^2 a token."""
    return 72.0 * channels**2 * tokens * layers


@dataclass(frozen=True)
class StepFloor:
    """A model's training step as its floors see it: attention layers and linear FLOPs."""

    attention: tuple[Attention, ...]
    linear: float

    def ms(self, dev: Device = H200) -> float:
        return sum(attention_ms(a, dev) for a in self.attention) + 1e3 * self.linear / dev.bf16_flops

    def attention_ms(self, dev: Device = H200) -> float:
        return sum(attention_ms(a, dev) for a in self.attention)


def deit_step(kind: str, batch: int, px: int = 224) -> StepFloor:
    """DeiT-T (12 layers, C 192, patch 16, a class token): InLine with 6 heads of 32 (as published),
    the softmax twin with 3 heads of 64."""
    n = (px // 16) ** 2 + 1
    heads = 6 if kind == "inline" else 3
    return StepFloor((Attention(kind, 12, batch, n, 192, heads),), linear_flops(batch * n, 192, 12))


SWIN_STAGES = ((56, 96, 2, 3), (28, 192, 2, 6), (14, 384, 6, 12), (7, 768, 2, 24))  # side, C, depth, heads


def swin_step(inline: bool, window: int, batch: int) -> StepFloor:
    """Swin-T at 224 px: InLine-Swin-T ("IIIS": InLine in stages 1-3, softmax windows of 7 in
    stage 4) or Swin-T (softmax everywhere), with ``window`` its InLine or softmax window (a window
    over a whole stage's grid is that grid)."""
    attention, linear = [], 0.0
    for i, (side, c, depth, heads) in enumerate(SWIN_STAGES):
        kind = "inline" if inline and i < 3 else "softmax"
        w = min(window if kind == "inline" or not inline else 7, side)
        attention.append(Attention(kind, depth, batch * (side // w) ** 2, w * w, c, heads))
        linear += linear_flops(batch * side * side, c, depth)
        if i:  # patch merging into this stage: 4 C' -> 2 C' = C on each merged token
            linear += 3 * 2 * 8 * (c // 2) ** 2 * batch * side * side
    return StepFloor(tuple(attention), linear)


def layer_ms(kind: str, batch: int, side: int, dev: Device = H200) -> float:
    """The attention layer (C 96, 3 heads of 32) fwd+bwd, bf16: its core, and the two projections'
    bytes (forward: x read, qkv written, O read, output written; backward: twice that and the
    weight gradients' reads: 14 B N C in all) and FLOPs (2 x 4 C^2 per token, x 3)."""
    tokens = batch * side * side
    proj_s = max(14 * tokens * 96 * BF16 / dev.copy_Bps, 24 * 96**2 * tokens / dev.bf16_flops)
    return attention_ms(Attention(kind, 1, batch, side * side, 96, 3), dev) + 1e3 * proj_s


def _fmt(x: float) -> str:
    """Milliseconds with three significant digits or one decimal."""
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 10 else f"{x:.1f}"


# gpu-check's core part (batch, tokens, channels): InLine-DeiT-T's layer, then C 96 at 14^2, 7^2, 56^2, 112^2
CORE_SHAPES = ((128, 197, 192), (256, 196, 96), (1024, 49, 96), (64, 3136, 96), (16, 12544, 96))
# the goal table's rows: key -> (what, goal); the values measured are in docs/benchmarks.md
ISSUE_ROWS = {
    "deit_eager": ("InLine-DeiT-T / DeiT-T, eager, 224 px, B 128", "reported beside the graphed goal"),
    "deit_graphed": ("InLine-DeiT-T / DeiT-T, CUDA-graphed", ">= 1.03x"),
    "deit1024": ("InLine-DeiT-T / DeiT-T at 1024 px, B 64", ">= 1.75x"),
    "swin_published": ("InLine-Swin-T (window 56) / Swin-T (window 7), B 64", ">= 1.3x"),
    "swin_w7": ("InLine-Swin-T / Swin-T, both at window 7, B 64", ">= 1.03x"),
    "swin_w56": ("InLine-Swin-T / Swin-T, both at window 56, B 64", ">= 6x"),
    "layer56": ("layer fwd+bwd / SDPA layer, 56x56 B 64", ">= 5x graphed"),
    "layer14": ("layer fwd+bwd / SDPA layer, 14x14 B 1024", ">= 2x graphed"),
    "core": (
        "Triton core fwd+bwd / copy rate: DeiT-T's layer and 14^2 B 256 / 7^2 B 1024 / 56^2 B 64 and 112^2 B 16",
        ">= 60 / 50 / 70 %",
    ),
    "inline_kernels": ("InLine kernels' GPU ms in an InLine-DeiT-T step, B 128", "<= 0.50 ms"),
    "cswin_busy": ("InLine-CSwin-T: GPU-busy share of a CUDA-graphed step (the trainer's default GPU path)", ">= 90 %"),
    "host": ("host time, layer fwd+bwd, InLine / SDPA layer (B 1, 4x4, C 96)", "<= 1.05x"),
    "compile": ("InLine-DeiT-T, torch.compile / eager, B 128", ">= 1.00x"),
}
# one profiled training step with AdamW on an H200 (B 128, run A of 2026-11-26, docs/benchmarks.md),
# kernels only (user-annotation spans left out): InLine-DeiT-T's GPU time 16.79 ms, 3.24 of it
# InLine's kernels; DeiT-T's 14.54
PROFILED_MS = dict(inline_busy=16.79, inline_kernels=3.24, softmax_busy=14.54)


def _row(key: str, floor: str, how: str) -> dict:
    what, goal = ISSUE_ROWS[key]
    return dict(what=what, goal=goal, floor=floor, how=how)


def _ratio_row(key: str, base: StepFloor, ours: StepFloor, dev: Device) -> dict:
    """A model row: the ratio of the two steps' floors, with their attention and linear parts."""

    def parts(s: StepFloor) -> str:
        linear = _fmt(1e3 * s.linear / dev.bf16_flops)
        return f"{_fmt(s.ms(dev))} ms (attention {_fmt(s.attention_ms(dev))}, linear {linear})"

    how = f"softmax side {parts(base)}; InLine side {parts(ours)}"
    return _row(key, f"{base.ms(dev) / ours.ms(dev):.2f}x", how)


def _deit_rows(dev: Device) -> list[dict]:
    """The two DeiT-T rows at 224 px: the floors, and InLine's core at its floor in the profiled step."""
    ours, base = deit_step("inline", 128), deit_step("softmax", 128)
    flash = core_flops(base.attention[0])
    core_ms = ours.attention_ms(dev)
    p = PROFILED_MS
    profiled = p["softmax_busy"] / (p["inline_busy"] - p["inline_kernels"] + core_ms)
    how = (
        f"cores: InLine {core_bytes(ours.attention[0]) / 1e9:.2f} GB = {_fmt(core_ms)} ms, flash {flash / 1e9:.0f} "
        f"GFLOP = {_fmt(1e3 * flash / dev.bf16_flops)} ms (its bytes: {_fmt(base.attention_ms(dev))} ms); linear "
        f"{ours.linear / 1e12:.2f} TFLOP = {_fmt(1e3 * ours.linear / dev.bf16_flops)} ms in both. Floors "
        f"{_fmt(base.ms(dev))} / {_fmt(ours.ms(dev))} ms = {base.ms(dev) / ours.ms(dev):.2f}x. InLine's core at its "
        f"floor, the rest as profiled: {p['softmax_busy']} / ({p['inline_busy']} - {p['inline_kernels']} + "
        f"{_fmt(core_ms)}) = {profiled:.2f}x"
    )
    floors = f"{base.ms(dev) / ours.ms(dev):.2f}x ({profiled:.2f}x with the rest as profiled)"
    return [_row("deit_eager", floors, how + "; eager adds the host's time"), _row("deit_graphed", floors, how)]


def _model_rows(dev: Device) -> list[dict]:
    published, swin7 = swin_step(True, 56, 64), swin_step(False, 7, 64)
    return [
        *_deit_rows(dev),
        _ratio_row("deit1024", deit_step("softmax", 64, 1024), deit_step("inline", 64, 1024), dev),
        _ratio_row("swin_published", swin7, published, dev),
        _ratio_row("swin_w7", swin7, swin_step(True, 7, 64), dev),
        _ratio_row("swin_w56", swin_step(False, 56, 64), published, dev),
    ]


def _layer_row(key: str, side: int, batch: int, dev: Device) -> dict:
    ours, base = layer_ms("inline", batch, side, dev), layer_ms("softmax", batch, side, dev)
    flash = core_flops(Attention("softmax", 1, batch, side * side, 96, 3))
    how = (
        f"InLine layer {_fmt(ours)} ms, SDPA layer {_fmt(base)} ms at their floors (about the same bytes, "
        f"{25 * batch * side * side * 96 * BF16 / 1e9:.2f} GB; flash's {flash / 1e9:.0f} GFLOP = "
        f"{_fmt(1e3 * flash / dev.bf16_flops)} ms)"
    )
    return _row(key, f"{base / ours:.2f}x", how)


def _kernel_rows(dev: Device) -> list[dict]:
    floor_ms = [1e3 * ELEMENTS_MOVED * b * n * c * BF16 / dev.copy_Bps for b, n, c in CORE_SHAPES]
    core = "11 B N C x 2 bytes at 4.2 TB/s: " + ", ".join(
        f"{n} tokens C {c} B {b} {_fmt(ms)} ms" for (b, n, c), ms in zip(CORE_SHAPES, floor_ms)
    )
    deit = deit_step("inline", 128).attention[0]
    mean_ms = 1e3 * 128 * 197 * 192 * BF16 * 12 / dev.copy_Bps
    kernels = (
        f"the core's {_fmt(attention_ms(deit, dev))} ms (as above) and the predictor's token mean, one read of x: "
        f"{_fmt(mean_ms)} ms"
    )
    return [
        _layer_row("layer56", 56, 64, dev),
        _layer_row("layer14", 14, 1024, dev),
        _row("core", "100 %", core),
        _row("inline_kernels", f"{_fmt(attention_ms(deit, dev) + mean_ms)} ms", kernels),
    ]


def _host_rows() -> list[dict]:
    cswin = (
        "no byte floor: the GPU is idle while the host launches. Busy 44 % of 135.2 ms eager (run A, kernels "
        "only); 90 % busy means a step of at most 66 ms at the same GPU time"
    )
    return [
        _row("cswin_busy", "-", cswin),
        _row("host", "-", "host time, no GPU floor (on the CPU: python -m inline_attn.bench.host)"),
        _row("compile", "-", "no floor: two step times of one model on one device"),
    ]


def goal_rows(dev: Device = H200) -> list[dict]:
    """The goal table, one dict per row: what, goal, floor (the value at the floors), how
    (the arithmetic)."""
    return _model_rows(dev) + _kernel_rows(dev) + _host_rows()


COLUMNS = ("what", "goal", "at the floors", "arithmetic")


def table(rows: Sequence[dict]) -> list[str]:
    """``rows`` of :func:`goal_rows` as Markdown lines."""
    keys = ("what", "goal", "floor", "how")
    return markdown_table([[r[k] for k in keys] for r in rows], COLUMNS)


if __name__ == "__main__":
    print("\n".join(table(goal_rows())))
