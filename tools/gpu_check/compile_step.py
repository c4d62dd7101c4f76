"""The ``compile`` step (the last default one): a training step of InLine-DeiT-T and of its
softmax twin DeiT-T, each eager, eager captured in a CUDA graph and under ``torch.compile`` (default
mode; on CUDA the InLine core's Triton kernels are launched from the compiled graph, the
``triton_op`` pair of :mod:`inline_attn.ops.fused.op`), all six in one process, timed interleaved
(224 px, B 128, bf16 autocast), with the method of :func:`inline_attn.bench.compiled.compile_ab`:
the same images, warm-up until no call compiles a new graph, the same number of rounds, the graphs
compiled while timing counted. InLine's compiled over eager-graphed is the goal row, compiled over
eager reported beside it. Inductor's first compile of each model takes most of the step's time;
the step runs last."""

from __future__ import annotations

from .budget import Part, StepContext, run_parts

BATCH = 128


def compare(ctx: StepContext) -> dict:
    """InLine-DeiT-T and DeiT-T, eager, eager-graphed and compiled -> ``values["compile_inline"]``
    (InLine's compiled / eager-graphed; nan where the eager steps could not be captured),
    ``values["compile_inline_eager"]`` (compiled / eager) and each model's ratios in ``ratios``."""
    from inline_attn.bench.compiled import compile_ab
    from inline_attn.bench.model import preset_cases

    cases, _ = preset_cases("resolution", (224,))
    repeats = 3 if ctx.quick else 6
    res = compile_ab(cases, batch=BATCH, device="cuda", amp="bf16", repeats=repeats, max_warmup=6, graphed=True)
    why = res["meta"]["why_not_graphed"]
    ratios = {r["model"]: r["ratio"] for r in res["rows"]}
    inline = next(r for r in res["rows"] if r["model"] == "InLine-DeiT-T")
    line = "; ".join(
        f"{r['model']} compiled / eager {r['ratio']:.2f}x, / eager-graphed {r['ratio_graphed']:.2f}x"
        for r in res["rows"]
    )
    note = (
        f"{inline['compiled_img_s']:.0f} against {inline['graphed_img_s']:.0f} img/s graphed, "
        f"{inline['eager_img_s']:.0f} eager; {line}; {inline['recompiles']} graphs compiled while timed"
    )
    graphed = float("nan") if why else inline["ratio_graphed"]
    return {
        "values": {"compile_inline": graphed, "compile_inline_eager": inline["ratio"]},
        "notes": {"compile_inline": note + (f"; not graphed: {why}" if why else ""), "compile_inline_eager": note},
        "ratios": ratios,
        "rows": res["rows"],
        "meta": res["meta"],
    }


# usual seconds: two inductor compiles and the timing took 53 and 77 s on an H200 (2026-11-26); the
# eager-graphed copies add two captures and a third of the timed rounds (an estimate: 10 s)
PARTS = (Part("deit-pair", 75, compare),)  # 64 s on the H200 (2026-11-28)


def run(ctx: StepContext) -> dict:
    result = run_parts(ctx, PARTS)
    ratios = result["parts"].get("deit-pair", {}).get("ratios", {})
    if ratios:
        result["summary"] += "; " + ", ".join(f"{m} compiled / eager {x:.2f}x" for m, x in ratios.items())
    return result
