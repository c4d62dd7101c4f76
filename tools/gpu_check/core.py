"""The Triton layer core alone (the custom op's kernels), bf16: its share of the copy rate, the
default kernels against the streaming ones at their own tiles (``core_kernels("stream")``) and
SDPA's core, and a copy of the same bytes, all timed interleaved in one run.

The fewest bytes a fwd+bwd must move: read Q, K, V and write O forward; read Q, K, V, dO and write
dQ, dK, dV backward: 11 B N C elements of 2 bytes. The copy case reads and writes that many bytes
(``dst.copy_(src)`` of half of them), so the core's share of the copy rate is the copy's time over
the core's, measured beside it (the device's copy rate drifts with clocks and temperature).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CoreShape:
    """A goal row's core: ``batch`` samples of a ``side`` x ``side`` grid after ``prefix`` tokens,
    ``heads`` heads of ``head_dim`` channels; ``key`` names its value (``core<key>``)."""

    key: str
    batch: int
    heads: int
    head_dim: int
    side: int
    prefix: int = 0

    @property
    def tokens(self) -> int:
        return self.prefix + self.side * self.side


# InLine-DeiT-T's layer (B 128, 197 tokens, 6 heads of 32), and Swin-T's first stage (3 heads of
# 32) at 7^2 B 1024, 14^2 B 256 (50,176 tokens), 56^2 B 64 and 112^2 B 16 (200,704)
CORE_SHAPES = (
    CoreShape("deit", 128, 6, 32, 14, 1),
    CoreShape("14", 256, 3, 32, 14),
    CoreShape("7", 1024, 3, 32, 7),
    CoreShape("56", 64, 3, 32, 56),
    CoreShape("112", 16, 3, 32, 112),
)
ELEMENTS_MOVED = 11  # x B N C: see the module docstring
# the core kernels timed: the library's default (None: the tuning table's winners where it has an
# entry, else the core kernels' rule) and the streaming ones at STREAM_TILES (triton.core_kernels)
KERNELS = {"default": None, "stream": "stream"}


def chosen_kernels(kind: str | None):
    """``triton.core_kernels(kind)``, or for None the library's default choice (nothing chosen
    explicitly, so the tuning table's winners apply)."""
    from inline_attn.ops.fused import triton as tc

    return contextlib.nullcontext() if kind is None else tc.core_kernels(kind)


def _core_step(tc, core: str | None, q, k, v, w9, g, args):
    def step():
        with chosen_kernels(core):
            tc.inline_forward_triton(q, k, v, w9, *args)
            tc.inline_backward_triton(q, k, v, w9, g, *args)

    return step


def _sdpa_step(q, k, v, heads: int):
    """SDPA's core (PyTorch's choice of backend) fwd+bwd on the same q, k, v."""
    import torch.nn.functional as F

    b, n, c = q.shape
    qh, kh, vh = (t.detach().view(b, n, heads, c // heads).transpose(1, 2).requires_grad_() for t in (q, k, v))

    def step():
        out = F.scaled_dot_product_attention(qh, kh, vh)
        torch.autograd.grad(out, (qh, kh, vh), out)

    return step


def core_row(shape: CoreShape) -> dict:
    """Time one shape's fwd+bwd with the default and the streaming kernels, SDPA's core and the copy of the
    same bytes, interleaved -> key, grid, batch, the launch each took, ms, GB/s, ``pct_of_copy``
    (the default kernels), ``stream_pct_of_copy`` and ``sdpa_ratio`` (SDPA's time / the default kernels')."""
    from inline_attn.bench.timing import time_interleaved
    from inline_attn.ops.fused import triton as tc

    b, n, heads, d = shape.batch, shape.tokens, shape.heads, shape.head_dim
    c = heads * d
    q, k, v = torch.randn(b, n, 3 * c, device="cuda", dtype=torch.bfloat16).chunk(3, dim=-1)
    w9 = torch.randn(b, 9, c, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(b, n, c, device="cuda", dtype=torch.bfloat16)
    args = (heads, d**-0.5, shape.side, shape.side, shape.prefix)
    nbytes = ELEMENTS_MOVED * b * n * c * 2
    src = torch.empty(nbytes // 4, device="cuda", dtype=torch.bfloat16)  # read + written: nbytes
    dst = torch.empty_like(src)
    cases = {name: _core_step(tc, core, q, k, v, w9, g, args) for name, core in KERNELS.items()}
    cases["sdpa"] = _sdpa_step(q, k, v, heads)
    cases["copy"] = lambda: dst.copy_(src)
    launches = {}
    for name, core in KERNELS.items():
        with tc.record_launches() as log:
            cases[name]()
        launches[name] = log[0].kernel
    t = {key: r.median for key, r in time_interleaved(cases, warmup=3, repeats=10, device="cuda").items()}
    return {
        "key": shape.key,
        "grid": f"{shape.side}x{shape.side}" + (f"+{shape.prefix}" if shape.prefix else ""),
        "batch": b,
        "launch": launches["default"],
        "stream_launch": launches["stream"],
        **{f"{name}_ms": t[name] * 1e3 for name in t},
        "GBps": nbytes / t["default"] / 1e9,
        "pct_of_copy": 100 * t["copy"] / t["default"],
        "stream_pct_of_copy": 100 * t["copy"] / t["stream"],
        "sdpa_ratio": t["sdpa"] / t["default"],
    }


def core_shares() -> list[dict]:
    """:func:`core_row` at every :data:`CORE_SHAPES`."""
    rows = []
    for shape in CORE_SHAPES:
        rows.append(core_row(shape))
        torch.cuda.empty_cache()  # this size's tensors before the next size's
    return rows
