"""The ``ncu`` step: Nsight Compute on the kernels of InLine-DeiT-T's layer (B 128, 197 tokens,
6 heads of 32, bf16): the predictor's, each way, and both designs of the core's (the
resident kernels and the streaming ones at their own tiles), each way.

A child process (``python -m tools.gpu_check.ncu_step``) runs the layer's six launches three
times; ``ncu`` profiles the second round (speed of light, occupancy, launch statistics and the
warps' stall reasons) and writes ``ncu.csv``. The summary line gives each kernel's duration,
registers per thread, achieved occupancy, memory throughput and the share of its warps' cycles
stalled at a barrier, on a global load (long scoreboard), on shared memory (short scoreboard) and
on the shared-memory queue (MIO throttle): what tells the barrier model (docs/benchmarks.md) from
memory latency, e.g. whether the resident forward's taps one at a time cost more round trips than
its second program a multiprocessor hides. Where ``ncu`` is not on the PATH the step is skipped,
saying so.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys
import time

from . import output
from .budget import StepContext

KERNELS = "regex:^(inline_(fwd|bwd)_(resident|stream)|predictor_(fwd|bwd))$"
ROUNDS, LAUNCHES = 3, 6  # rounds of the layer step; launches a round
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats")
CORES = ("resident", "stream")  # the core's two designs (triton.core_kernels), each profiled each way
METRICS = {  # ncu's metric name -> the summary's
    "Duration": "duration",
    "Registers Per Thread": "registers",
    "Achieved Occupancy": "occupancy",
    "Memory Throughput": "memory",
    # the warps' stall reasons, each a share of their active cycles (requested by name: --metrics)
    "smsp__warp_issue_stalled_barrier_per_warp_active.pct": "barrier stalls",
    "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct": "global-load stalls",
    "smsp__warp_issue_stalled_short_scoreboard_per_warp_active.pct": "shared-memory stalls",
    "smsp__warp_issue_stalled_mio_throttle_per_warp_active.pct": "MIO-throttle stalls",
}
STALLS = [name for name in METRICS if name.startswith("smsp__")]


def command(out_csv: str, stalls: bool = True) -> list[str]:
    """The ncu command line: the second round's launches of the kernels, as CSV (with ``stalls``,
    the stall reasons' metrics too)."""
    cmd = ["ncu", "--target-processes", "all", "--kernel-name", KERNELS]
    cmd += ["--launch-skip", str(LAUNCHES), "--launch-count", str(LAUNCHES), "--csv", "--page", "details"]
    for section in SECTIONS:
        cmd += ["--section", section]
    if stalls:
        cmd += ["--metrics", ",".join(STALLS)]
    return cmd + ["--log-file", out_csv, sys.executable, "-m", "tools.gpu_check.ncu_step"]


def parse(text: str) -> dict[str, dict[str, str]]:
    """ncu's details CSV -> kernel name -> {summary name: "value unit"} for :data:`METRICS`."""
    start = text.find('"ID"')
    rows = csv.DictReader(io.StringIO(text[start:])) if start >= 0 else []
    out: dict[str, dict[str, str]] = {}
    for row in rows:
        name = METRICS.get(row.get("Metric Name", ""))
        if name:
            kernel = row["Kernel Name"].split("(")[0]
            out.setdefault(kernel, {})[name] = f"{row['Metric Value']} {row.get('Metric Unit', '')}".strip()
    return out


def run(ctx: StepContext) -> dict:
    """Profile the layer's kernels with ncu within the step's box -> the step's result."""
    if shutil.which("ncu") is None:
        return {"ok": None, "summary": "skipped: ncu (Nsight Compute) is not on this machine's PATH"}
    out_csv = ctx.out / "ncu.csv"
    note = ""
    for stalls in (True, False):
        out_csv.unlink(missing_ok=True)
        timeout = max(1.0, ctx.deadline - time.time())
        try:
            proc = subprocess.run(command(str(out_csv), stalls), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"ok": False, "summary": f"ncu did not finish in its box ({timeout:.0f} s)"}
        if proc.returncode == 0 and out_csv.is_file():
            break
        said = proc.stdout[-3000:] + proc.stderr[-3000:] + (out_csv.read_text()[-3000:] if out_csv.is_file() else "")
        ctx.error("ncu", said)
        if not stalls or not _refused_a_metric(said):
            return {"ok": False, "summary": f"ncu exited {proc.returncode}{note} (errors.txt)"}
        # an ncu that does not know a stall metric's name: the sections alone, saying so
        note = "; without the stall reasons, whose metrics this ncu refused (errors.txt)"
    output.cap_log(out_csv)
    kernels = parse(out_csv.read_text())
    line = "; ".join(f"{k}: " + ", ".join(f"{m} {v}" for m, v in ms.items()) for k, ms in kernels.items())
    return {"ok": bool(kernels), "summary": (line or "ncu profiled no kernel") + note, "kernels": kernels}


def _refused_a_metric(text: str) -> bool:
    """Whether ncu's output has an error line about a metric (a name this version does not know)."""
    return any(line.startswith("==ERROR==") and "metric" in line.lower() for line in text.splitlines())


def target() -> None:
    """The profiled process: :data:`ROUNDS` rounds of InLine-DeiT-T's layer launches (B 128, bf16),
    the core under each of :data:`CORES`."""
    import torch

    from inline_attn.ops.fused import triton as tc

    b, n, heads, d = 128, 197, 6, 32
    c = heads * d
    x = torch.randn(b, n, c, device="cuda", dtype=torch.bfloat16)
    q, k, v = torch.randn(b, n, 3 * c, device="cuda", dtype=torch.bfloat16).chunk(3, dim=-1)
    g = torch.randn_like(x)
    w1, w2 = (torch.randn(r * c, d, device="cuda") * d**-0.5 for r in (1, 9))
    b1, b2 = (torch.zeros(r * c, device="cuda") for r in (1, 9))
    for _ in range(ROUNDS):
        ctx, taps = tc.predictor_forward_triton(x, w1, b1, w2, b2, heads)
        for core in CORES:
            with tc.core_kernels(core):
                tc.inline_forward_triton(q, k, v, taps, heads, d**-0.5, 14, 14, 1)
                _, _, _, dtaps = tc.inline_backward_triton(q, k, v, taps, g, heads, d**-0.5, 14, 14, 1)
        tc.predictor_backward_triton(ctx, dtaps, w1, b1, w2, n, heads)
    torch.cuda.synchronize()


if __name__ == "__main__":
    target()
