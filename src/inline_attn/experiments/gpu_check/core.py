"""The Triton layer core alone (the custom op's kernels), bf16: its share of the copy rate.

The fewest bytes a fwd+bwd must move: read Q, K, V and write O forward; read Q, K, V, dO and write
dQ, dK, dV backward: 11 B N C elements of 2 bytes. Achieved bandwidth = those bytes / the
measured time; its share of the device's copy rate (:func:`.device.copy_bandwidth`) is the goal.
"""

from __future__ import annotations

import torch

# (batch, heads, head dim, grid side): 50,176 tokens at 7^2 and 14^2, 200,704 at 56^2 and 112^2;
# 3 heads of 32 (Swin-T's stage 1)
CORE_SHAPES = ((1024, 3, 32, 7), (256, 3, 32, 14), (64, 3, 32, 56), (16, 3, 32, 112))
ELEMENTS_MOVED = 11  # x B N C: see the module docstring


def core_row(batch: int, heads: int, d: int, side: int) -> dict:
    """Time the forward and backward kernels at one shape -> grid, batch, the launch taken, fwd /
    bwd ms, GB/s; where it is the resident launch, the fused launch's GB/s beside it (interleaved)."""
    from ...bench.timing import time_interleaved
    from ...ops.fused import triton as tc

    n, c = side * side, heads * d
    q, k, v = torch.randn(batch, n, 3 * c, device="cuda", dtype=torch.bfloat16).chunk(3, dim=-1)
    w9 = torch.randn(batch, 9, c, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(batch, n, c, device="cuda", dtype=torch.bfloat16)
    args = (heads, d**-0.5, side, side, 0)

    def steps(resident: bool) -> dict:
        def fwd():
            with tc.resident_launch(resident):
                tc.inline_forward_triton(q, k, v, w9, *args)

        def bwd():
            with tc.resident_launch(resident):
                tc.inline_backward_triton(q, k, v, w9, g, *args)

        return {f"fwd_{resident}": fwd, f"bwd_{resident}": bwd}

    with tc.record_launches() as log:
        tc.inline_forward_triton(q, k, v, w9, *args)
    resident = log[0].kernel == "inline_fwd_resident"
    cases = {**steps(True), **(steps(False) if resident else {})}
    t = time_interleaved(cases, warmup=3, repeats=10, device="cuda")
    nbytes = ELEMENTS_MOVED * batch * n * c * 2
    fwd, bwd = t["fwd_True"].median, t["bwd_True"].median
    row = {
        "grid": f"{side}x{side}",
        "side": side,
        "batch": batch,
        "launch": {"inline_fwd_resident": "resident", "inline_fwd_fused": "fused"}.get(log[0].kernel, "split"),
        "fwd_ms": fwd * 1e3,
        "bwd_ms": bwd * 1e3,
        "GBps": nbytes / (fwd + bwd) / 1e9,
    }
    if resident:
        row["fused_GBps"] = nbytes / (t["fwd_False"].median + t["bwd_False"].median) / 1e9
    return row


def core_shares(copy_gbps: float) -> list[dict]:
    """:func:`core_row` at every :data:`CORE_SHAPES`, each with ``pct_of_copy``."""
    rows = []
    for shape in CORE_SHAPES:
        rows.append(core_row(*shape))
        torch.cuda.empty_cache()  # this size's tensors before the next size's
    for r in rows:
        r["pct_of_copy"] = 100 * r["GBps"] / copy_gbps
    return rows
