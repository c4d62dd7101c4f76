"""The ``compile`` step (the last default one): a training step of InLine-DeiT-T and of its
softmax twin DeiT-T, each eager and under ``torch.compile`` (default mode), all four in one process,
timed interleaved (224 px, B 128, bf16 autocast), with the method of
:func:`inline_attn.bench.compiled.compile_ab`: the same images, warm-up until no call compiles a new
graph, the same number of rounds, the graphs compiled while timing counted. Both ratios, compiled
over eager, are printed; InLine's is the goal row. Inductor's first compile of each model takes most
of the step's time; the step runs last."""

from __future__ import annotations

from .budget import Part, StepContext, run_parts

BATCH = 128


def compare(ctx: StepContext) -> dict:
    """InLine-DeiT-T and DeiT-T, eager and compiled -> ``values["compile_inline"]`` (InLine's
    compiled / eager) and each model's ratio in ``ratios``."""
    from inline_attn.bench.compiled import compile_ab
    from inline_attn.bench.model import preset_cases

    cases, _ = preset_cases("resolution", (224,))
    res = compile_ab(cases, batch=BATCH, device="cuda", amp="bf16", repeats=3 if ctx.quick else 6, max_warmup=6)
    ratios = {r["model"]: r["ratio"] for r in res["rows"]}
    inline = next(r for r in res["rows"] if r["model"] == "InLine-DeiT-T")
    line = "; ".join(f"{m} compiled / eager {x:.2f}x" for m, x in ratios.items())
    note = (
        f"{inline['compiled_img_s']:.0f} against {inline['eager_img_s']:.0f} img/s; {line}; "
        f"{inline['recompiles']} graphs compiled while timed"
    )
    return {
        "values": {"compile_inline": ratios["InLine-DeiT-T"]},
        "notes": {"compile_inline": note},
        "ratios": ratios,
        "rows": res["rows"],
        "meta": res["meta"],
    }


# usual seconds: two inductor compiles and the timing took 53 and 77 s on an H200 (2026-11-26)
PARTS = (Part("deit-pair", 90, compare),)


def run(ctx: StepContext) -> dict:
    result = run_parts(ctx, PARTS)
    ratios = result["parts"].get("deit-pair", {}).get("ratios", {})
    if ratios:
        result["summary"] += "; " + ", ".join(f"{m} compiled / eager {x:.2f}x" for m, x in ratios.items())
    return result
