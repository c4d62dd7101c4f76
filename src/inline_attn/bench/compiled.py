"""Compiled against eager: each model's training step under ``torch.compile`` and eager, for InLine
and its softmax twin, in one process, timed interleaved.

The method (the same on the CPU and on a GPU, where ``make gpu-check --steps compile`` runs it):

- each model is built twice from one seed (eager, and wrapped by :func:`inline_attn.runtime.compile.compile_module`);
  every case steps on the same images and targets: forward, cross-entropy, backward (no optimizer);
- warm-up past the recompiles: a compiled case is called until a call compiles no new graph
  (at least ``warmup`` calls, at most ``max_warmup``); every case gets the warm-up calls of the
  slowest to settle, and the graphs compiled while timing are counted (``recompiles``, 0 expected);
- every case is timed for the same number of rounds, round-robin (A, A compiled, B, B compiled, ...);
- the clock: on the CPU this thread's CPU time per step with one intra-op thread (inductor then
  generates single-threaded code, the autograd engine runs a CPU backward on the calling thread,
  and other processes on a shared machine do not count); on CUDA, CUDA events
  (:func:`.timing.time_interleaved`).

Run ``python -m inline_attn.bench.compiled`` (``--help`` for the options).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from ..runtime.compile import compile_module
from ..runtime.report import markdown_table
from .model import ModelCase, preset_cases
from ..runtime.amp import amp_dtype
from .sweep import run_context
from .timing import synchronize, thread_times_interleaved, time_interleaved

__all__ = ["compile_ab", "compiled_graphs", "training_step", "warm_until_compiled"]


def compiled_graphs() -> int:
    """How many graphs ``torch.compile`` has compiled in this process so far (dynamo's count)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def training_step(
    model: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, amp: Optional[torch.dtype] = None
) -> Callable[[], None]:
    """One training step of ``model`` on images x [B, 3, H, W] and class indices target [B]:
    gradients cleared, forward under autocast to ``amp`` (None: none), cross-entropy in float32,
    backward."""

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with run_context(x.device.type, amp=amp):
            out = model(x)
        F.cross_entropy(out.float(), target).backward()

    return step


def warm_until_compiled(step: Callable[[], None], warmup: int, max_warmup: int) -> int:
    """Call ``step`` until a call compiles no new graph (at least ``warmup`` calls, at most
    ``max_warmup``) -> the calls made."""
    calls = 0
    while calls < max_warmup:
        before = compiled_graphs()
        step()
        calls += 1
        if calls >= warmup and compiled_graphs() == before:
            break
    return calls


def _timed(steps: dict, repeats: int, device: torch.device) -> dict[str, list[float]]:
    if device.type == "cpu":
        return thread_times_interleaved(steps, repeats=repeats)
    timings = time_interleaved(steps, warmup=0, repeats=repeats, min_repeats=repeats, device=device)
    failed = {k: t.status for k, t in timings.items() if not t.ok}
    if failed:
        raise RuntimeError(f"compiled against eager: steps failed while timed: {failed}")
    return {k: t.times for k, t in timings.items()}


GRAPHED = " graphed"  # the suffix of an eager case captured in a CUDA graph


def _build_steps(cases, batch, device, amp, compile_mode, seed, graphed=False) -> dict[str, Callable[[], None]]:
    """label -> step for every case, its compiled twin (``"<label> compiled"``) and with ``graphed``
    a third copy of the eager model (``"<label> graphed"``, captured later), same images."""
    gen = torch.Generator().manual_seed(seed)
    res = {c.resolution for c in cases}
    x = {r: torch.randn(batch, 3, r, r, generator=gen).to(device) for r in res}
    target = torch.randint(0, 10, (batch,), generator=gen).to(device)
    steps = {}
    for case in cases:
        for suffix in ("", " compiled") + ((GRAPHED,) if graphed else ()):
            torch.manual_seed(seed)
            model = case.build().to(device).train()
            runner = compile_module(model, compile_mode) if suffix == " compiled" else model
            steps[case.label + suffix] = training_step(runner, x[case.resolution], target, amp)
    return steps


def _rows(cases, times: dict, batch: int, recompiles: int) -> list[dict]:
    rows = []
    for case in cases:
        eager, compiled = (statistics.median(times[k]) for k in (case.label, f"{case.label} compiled"))
        row = {
            "model": case.label,
            "eager_ms": eager * 1e3,
            "compiled_ms": compiled * 1e3,
            "eager_img_s": batch / eager,
            "compiled_img_s": batch / compiled,
            "ratio": eager / compiled,  # compiled throughput over eager
            "repeats": len(times[case.label]),
            "recompiles": recompiles,
        }
        if case.label + GRAPHED in times:
            graphed = statistics.median(times[case.label + GRAPHED])
            row.update(graphed_ms=graphed * 1e3, graphed_img_s=batch / graphed, ratio_graphed=graphed / compiled)
        rows.append(row)
    return rows


def compile_ab(
    cases: Optional[Sequence[ModelCase]] = None,
    *,
    batch: int = 4,
    device: str = "cpu",
    amp: Optional[str] = None,
    repeats: int = 10,
    warmup: int = 2,
    max_warmup: int = 8,
    compile_mode: str = "default",
    threads: int = 1,
    seed: int = 0,
    graphed: bool = False,
) -> dict:
    """Each case's training step, eager and compiled, timed interleaved (the method: module docstring).

    Args:
        cases: the models (default: DeiT-T and InLine-DeiT-T at 224 px, :func:`.model.preset_cases`).
        batch: images per step. device: "cpu" or "cuda". amp: None, "bf16" or "fp16" (autocast).
        repeats: timed rounds. warmup, max_warmup: the least and most warm-up calls of a case.
        compile_mode: :data:`inline_attn.runtime.compile.COMPILE_MODES`.
        threads: intra-op threads on the CPU while measuring (restored after).
        graphed: also time each eager model captured in a CUDA graph
            (:func:`inline_attn.runtime.graphs.graph_steps`; where it cannot be, ungraphed and
            ``meta["why_not_graphed"]`` says why).
    Returns:
        ``{"meta": {...}, "rows": [{"model", "eager_ms", "compiled_ms", "eager_img_s",
        "compiled_img_s", "ratio", "repeats", "recompiles"}]}``; ``ratio`` is compiled over eager
        throughput (above 1: compile helps); with ``graphed`` each row adds ``graphed_ms``,
        ``graphed_img_s`` and ``ratio_graphed`` (compiled over eager-graphed throughput).
    """
    cases = list(cases) if cases is not None else preset_cases("resolution", (224,))[0]
    if batch <= 0 or repeats <= 0 or not 0 <= warmup <= max_warmup or max_warmup < 1:
        raise ValueError(
            f"batch={batch}, repeats={repeats}, warmup={warmup}, max_warmup={max_warmup}: expected positive "
            "batch and repeats and 0 <= warmup <= max_warmup, max_warmup >= 1"
        )
    dev, autocast = torch.device(device), amp_dtype(amp)
    previous = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(threads)
    try:
        steps = _build_steps(cases, batch, dev, autocast, compile_mode, seed, graphed)
        calls = {k: warm_until_compiled(s, warmup, max_warmup) for k, s in steps.items() if k.endswith("compiled")}
        settled = max(calls.values())
        for label, step in steps.items():  # every case as many warm-up calls as the slowest to settle
            for _ in range(settled - calls.get(label, 0)):
                step()
        why_not = _capture_graphed(steps, dev) if graphed else None
        synchronize(dev)
        before = compiled_graphs()
        times = _timed(steps, repeats, dev)
        recompiles = compiled_graphs() - before
    finally:
        torch.set_num_threads(previous)
    meta = dict(
        batch=batch,
        device=str(dev),
        amp=amp or "none",
        repeats=repeats,
        warmup_calls=settled,
        compile_mode=compile_mode,
        threads=threads if dev.type == "cpu" else None,
        clock="thread CPU time" if dev.type == "cpu" else "CUDA events",
        torch=torch.__version__,
    )
    if graphed:
        meta["why_not_graphed"] = why_not
    return {"meta": meta, "rows": _rows(cases, times, batch, recompiles)}


def _capture_graphed(steps: dict, device: torch.device) -> Optional[str]:
    """Replace the ``"<label> graphed"`` steps by their CUDA-graph replays -> why not, or None."""
    from ..runtime.graphs import graph_steps

    eager = {k: s for k, s in steps.items() if k.endswith(GRAPHED)}
    captured, why_not = graph_steps(eager, device)
    steps.update(captured)
    return why_not


COLUMNS = ("model", "eager ms", "compiled ms", "compiled / eager", "recompiles while timed")


def table(result: dict) -> list[str]:
    """The result as Markdown lines: one row per model."""
    rows = [
        (r["model"], f"{r['eager_ms']:.1f}", f"{r['compiled_ms']:.1f}", f"{r['ratio']:.2f}x", r["recompiles"])
        for r in result["rows"]
    ]
    return markdown_table(rows, COLUMNS)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m inline_attn.bench.compiled", description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--resolution", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=10, help="timed rounds (default 10)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--amp", choices=("none", "bf16", "fp16"), default="none")
    args = ap.parse_args(argv)
    cases, _ = preset_cases("resolution", (args.resolution,))
    result = compile_ab(
        cases, batch=args.batch, device=args.device, amp=args.amp, repeats=args.repeats, threads=args.threads
    )
    m = result["meta"]
    print(
        f"training step, batch {m['batch']}, {args.resolution} px, {m['device']}, amp {m['amp']}, "
        f"{m['clock']}, {m['repeats']} interleaved rounds after {m['warmup_calls']} warm-up calls, medians:"
    )
    print("\n".join(table(result)))


if __name__ == "__main__":
    main()
