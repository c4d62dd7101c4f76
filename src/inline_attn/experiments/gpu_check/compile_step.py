"""The ``compile`` step (on demand: ``--steps compile``): a training step of InLine-DeiT-T and of
its softmax twin DeiT-T under ``torch.compile`` (default mode) against eager, each pair timed
interleaved (224 px, B 128, bf16 autocast). Inductor's first compile of each model takes most of
its time, which is why it is not in the default run."""

from __future__ import annotations

import functools

from .budget import Part, StepContext, run_parts

BATCH = 128


def compare(ctx: StepContext, label: str) -> dict:
    """``label``'s compiled against eager throughput (``compile_inline`` for InLine-DeiT-T)."""
    from ...bench.model import ModelCase, bench_models, preset_cases

    case = next(c for c in preset_cases("resolution", (224,))[0] if c.label == label)
    cases = [case, ModelCase(f"{label} compiled", case.name, 224, 224, {**case.overrides, "compile": 1})]
    timing = dict(warmup=3, repeats=3 if ctx.quick else 6, budget_s=2.0, memory=False)
    res = bench_models(cases, batch=BATCH, mode="train", macs=False, device="cuda", amp="bf16", **timing)
    eager, compiled = res["rows"]
    ratio = compiled["throughput"] / eager["throughput"]
    record = {"rows": res["rows"], "ratio": ratio}
    if label == "InLine-DeiT-T":
        record["values"] = {"compile_inline": ratio}
        record["notes"] = {"compile_inline": f"{compiled['throughput']:.0f} against {eager['throughput']:.0f} img/s"}
    return record


# usual seconds on an H100: one inductor compile and the timing (G1 / G2: about 45 s a model)
PARTS = tuple(Part(label.lower(), 45, functools.partial(compare, label=label)) for label in ("InLine-DeiT-T", "DeiT-T"))


def run(ctx: StepContext) -> dict:
    result = run_parts(ctx, PARTS)
    twin = result["parts"].get("deit-t", {})
    if "ratio" in twin:
        line = f"DeiT-T (softmax twin) compiled / eager {twin['ratio']:.2f}x"
        result["summary"] += f"; {line}"
        if "compile_inline" in result["notes"]:
            result["notes"]["compile_inline"] += f"; {line}"
    return result
