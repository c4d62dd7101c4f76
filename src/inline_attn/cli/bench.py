"""``inline-attn bench attention | residual | model``: tables to the terminal, CSV/JSON (and a PNG) to ``--out``."""

from __future__ import annotations

import argparse
import math
from typing import Optional

import torch

from .._io import writable_dir
from ..runtime.compile import COMPILE_MODES
from ..bench.attention import DEFAULT_LAYER_KINDS, LAYER_KINDS, QUICK, SWEEP
from ..bench.model import PRESETS
from ..bench.report import format_table
from ..bench.sweep import check_counts


def _setup(args) -> None:
    writable_dir(args.out, "--out")
    check_counts(warmup=args.warmup, repeats=args.repeats, threads=args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)


def _sweep_kwargs(args) -> dict:
    """The options that bench attention and bench model share (:func:`_common`'s and
    :func:`_compile_mode_arg`'s) as :func:`bench_attention`'s and :func:`bench_models`' arguments."""
    return dict(
        dtype=args.dtype,
        device=args.device,
        amp=args.amp,
        warmup=args.warmup,
        repeats=args.repeats,
        budget_s=args.budget,
        memory=not args.no_memory,
        compile_mode=args.compile_mode,
        cuda_graphs=args.cuda_graphs,
    )


def _print(result: dict, paths: dict, columns) -> int:
    meta = result["meta"]
    if meta.get("cuda_graphs") and meta.get("why_not_graphed"):
        print(f"--cuda-graphs: {meta['why_not_graphed']}; those steps were timed without CUDA graphs")
    print(format_table(result["rows"], columns, markdown=True))
    if "matmul_gflops" in meta:
        print(f"float32 matmul rate (1024^3, same run): {meta['matmul_gflops']:.1f} GFLOP/s")
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _seconds(text: str) -> float:
    """--budget: a finite number of seconds > 0 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"--budget {text!r}: expected a finite number of seconds > 0")
    return value


def _cmd_attention(args) -> int:
    from ..bench.attention import LAYER_COLUMNS, run_attention_bench

    # a flag not given (None) takes the preset's value (--quick's or the full sweep's); one given wins,
    # and `or` keeps it: --repeats 0 is refused by _setup, --budget 0 by its type, --sizes is a list
    _setup(args)
    args.repeats, args.budget = args.repeats or args.preset["repeats"], args.budget or args.preset["budget_s"]
    result, paths = run_attention_bench(
        args.out,
        args.name,
        plot=not args.no_plot,
        sizes=args.sizes or args.preset["sizes"],
        kinds=args.kinds,
        dim=args.dim,
        heads=args.heads,
        batch=args.batch,
        token_budget=args.tokens,
        modes=args.modes,
        compile=args.compile,
        **_sweep_kwargs(args),
    )
    return _print(result, paths, LAYER_COLUMNS)


def _cmd_residual(args) -> int:
    from ..bench.attention import RESIDUAL_COLUMNS, run_residual_bench

    _setup(args)
    result, paths = run_residual_bench(args.out, args.name, **_sweep_kwargs(args))
    print(format_table(result["rows"], RESIDUAL_COLUMNS))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _cmd_model(args) -> int:
    from ..bench.attention import LAYER_COLUMNS
    from ..bench.model import BREAKDOWN_COLUMNS, MODEL_COLUMNS, run_model_bench

    _setup(args)
    result, paths = run_model_bench(
        args.out,
        args.name,
        models=args.models,
        resolutions=args.resolutions,
        preset=args.preset,
        values=args.values,
        compile=args.compile,
        batch=args.batch,
        mode=args.mode,
        macs=not args.no_macs,
        sdpa=args.sdpa,
        baseline=args.baseline,
        breakdown=args.breakdown,
        channels_last=args.channels_last,
        plot=not args.no_plot,
        **_sweep_kwargs(args),
    )
    if args.preset == "layer":
        return _print(result, paths, LAYER_COLUMNS)
    if args.breakdown:
        print(
            "time by operator category (torch.profiler, mean of 3 steps; bound = the speedup over "
            f"{result['meta']['baseline']} with a free attention core):"
        )
        print(format_table(result["rows"], BREAKDOWN_COLUMNS))
    return _print(result, paths, MODEL_COLUMNS)


def _common(
    p: argparse.ArgumentParser, default_name: str, repeats: int, budget: float, quick: Optional[dict] = None
) -> None:
    """The options every benchmark takes; ``quick``: a preset (:data:`QUICK`) that fills --repeats
    and --budget where they are not given (bench attention's ``args.preset`` holds the values they take then)."""
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 (default float32)")
    p.add_argument(
        "--amp",
        default="none",
        choices=["none", "bf16", "fp16"],
        help="autocast around each step, as in mixed-precision training (default none)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls per case (default 1)")
    quick_repeats, quick_budget = (
        (f"; --quick: {quick['repeats']}", f"; --quick: {quick['budget_s']}") if quick else ("", "")
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None if quick else repeats,
        help=f"timed interleaved rounds (default {repeats}{quick_repeats})",
    )
    p.add_argument(
        "--budget",
        type=_seconds,
        default=None if quick else budget,
        help="stop repeating a sweep point after this many seconds per case, once 2 rounds ran "
        f"(default {budget}{quick_budget})",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--out", default="bench_results", help="output folder (default bench_results)")
    p.add_argument("--name", default=default_name, help=f"file stem of the outputs (default {default_name})")


def _attention_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=None,
        help="grid sides (default {}; --quick: {})".format(*(" ".join(map(str, d["sizes"])) for d in (SWEEP, QUICK))),
    )
    p.add_argument(
        "--kinds",
        nargs="+",
        default=list(DEFAULT_LAYER_KINDS),
        metavar="KIND",
        help=f"{' '.join(LAYER_KINDS)}, each optionally with '+compile'; inline-eager: without the "
        "fused kernels (the authors' order of operations); softmax-math: explicit N x N softmax; "
        "hydra ... focused: the other linear attentions of the paper's comparison "
        f"(default: {' '.join(DEFAULT_LAYER_KINDS)}, uncompiled)",
    )
    p.add_argument("--dim", type=int, default=96)
    p.add_argument("--heads", type=int, default=3)
    p.add_argument("--batch", type=int, default=None, help="fixed batch (default: constant token budget)")
    p.add_argument(
        "--tokens",
        type=int,
        default=8 * 56 * 56,
        help="token budget per batch when --batch is not given: batch = tokens // S^2 (default 25088)",
    )
    p.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    p.add_argument("--compile", action="store_true", help="torch.compile every layer (compiled in the warm-up)")
    p.add_argument(
        "--quick",
        dest="preset",
        action="store_const",
        const=QUICK,
        default=SWEEP,
        help="a first look in about a minute on a CPU: grids 7, 14 and 28, 3 rounds, at most 2 s per case "
        "(--sizes, --repeats and --budget given win over these)",
    )
    _compile_mode_arg(p)


def _compile_mode_arg(p) -> None:
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="capture each step in a CUDA graph and time its replay (compiled cases: mode reduce-overhead); "
        "on a device without CUDA graphs the steps run ungraphed and the reason is printed",
    )
    p.add_argument(
        "--compile-mode",
        default="default",
        choices=COMPILE_MODES,
        help="torch.compile mode of the compiled cases (reduce-overhead: CUDA graphs; default: default)",
    )


def register(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks: attention layers and whole models")
    sub = bench.add_subparsers(dest="bench_command", metavar="BENCH")
    sub.required = True

    pa = sub.add_parser("attention", help="InLine vs linear vs softmax layers over token grids (interleaved)")
    _attention_args(pa)
    _common(pa, "attention", SWEEP["repeats"], SWEEP["budget_s"], quick=QUICK)
    pa.set_defaults(func=_cmd_attention)

    pr = sub.add_parser("residual", help="the local residual: nine shifted multiply-adds vs one grouped conv")
    _common(pr, "residual", repeats=9, budget=10.0)
    _compile_mode_arg(pr)  # refused unless default: the residual is measured eagerly
    pr.set_defaults(func=_cmd_residual)

    pm = sub.add_parser("model", help="throughput, latency, peak memory and MACs of registered models")
    pm.add_argument(
        "--models",
        nargs="+",
        default=[],
        metavar="SPEC",
        help="[label=]name[:key=value,...], e.g. DeiT-T=inline_deit_tiny:pattern=S,num_heads=3",
    )
    pm.add_argument("--resolutions", type=int, nargs="+", default=[224])
    pm.add_argument("--batch", type=int, default=None, help="images per step (default 8)")
    pm.add_argument("--mode", default="infer", choices=["infer", "train"])
    pm.add_argument(
        "--preset",
        choices=list(PRESETS),
        default=None,
        help="window: Swin-T vs InLine-Swin-T, windows 7/14/28/56 at 224; resolution: DeiT-T vs "
        "InLine-DeiT-T at 224/384/640/1024; layer: the attention layers (= bench attention)",
    )
    pm.add_argument("--values", type=int, nargs="+", default=None, help="override a preset's sweep values")
    pm.add_argument(
        "--sdpa",
        choices=["math"],
        default=None,
        help="math: explicit N x N softmax attention (as the reference code) instead of fused SDPA",
    )
    pm.add_argument("--baseline", default=None, help="label the speedups divide by (default: the first)")
    pm.add_argument("--no-macs", action="store_true", help="skip counting MACs")
    pm.add_argument("--channels-last", action="store_true", help="channels-last input images and convolutions")
    pm.add_argument("--compile", action="store_true", help="torch.compile every model (same as compile=1 in each spec)")
    _compile_mode_arg(pm)
    pm.add_argument(
        "--breakdown",
        action="store_true",
        help="profile three more steps per case: ms per operator category, the attention core's "
        "share and the speedup bound with a free attention core",
    )
    _common(pm, "model", repeats=5, budget=60.0)
    pm.set_defaults(func=_cmd_model)
