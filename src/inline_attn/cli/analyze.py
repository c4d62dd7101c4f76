"""``inline-attn analyze <analysis>``: the paper's analyses from the command line.

Each command picks its models from the options, then :func:`inline_attn.analysis.analyze.run_analysis`
writes the numbers (CSV and/or JSON, a Markdown table) and PNG figures into ``--out``.
"""

from __future__ import annotations

import pathlib
from typing import Optional

from .._io import writable_dir
from ..analysis.analyze import ANALYSES, OPTION_ANALYSES, check_options


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "analyze",
        help="the paper's analyses: injectivity, confusion, attention maps, locality, masking",
        description="Run one of the paper's analyses on registered models / checkpoints and write "
        "CSV/JSON numbers and PNG figures to --out.",
    )
    p.add_argument("analysis", choices=ANALYSES, help="which analysis to run")
    _add_model_options(p)
    _add_data_options(p)
    _add_analysis_options(p)
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads (0: leave as is; 1 is fastest on a machine shared with other jobs)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.set_defaults(func=run)


def _add_model_options(p) -> None:
    """Which models: names, checkpoints or attention kinds."""
    p.add_argument(
        "--model",
        nargs="+",
        default=None,
        metavar="NAME",
        help="registered model name(s); one per --checkpoint (optional when every "
        "checkpoint is a training run folder, whose config names the model)",
    )
    p.add_argument(
        "--checkpoint",
        nargs="+",
        default=None,
        metavar="PATH",
        help="checkpoint file or training run folder per model ('none': random init)",
    )
    p.add_argument(
        "--kinds",
        nargs="+",
        default=None,
        metavar="KIND",
        help="compare attention kinds: one --model NAME per kind with every stage of that kind (random init), "
        "or one --checkpoint per kind (trained models), or the trained part-d models of --runs; injectivity: "
        "the constructed queries through each kind's layer (trained models: their first attention layer, or "
        "the first of --layers)",
    )
    p.add_argument(
        "--runs",
        default=None,
        metavar="FOLDER",
        help="compare the trained models of the ablations' part d (the --output of `inline-attn reproduce "
        "ablations`): the run of each --kinds kind (default all eleven) and seed --run-seed",
    )
    p.add_argument(
        "--run-seed",
        type=int,
        default=None,
        metavar="N",
        help="--runs: the seed of the runs to compare (default: --seed, so the masks and the runs share it as in "
        "part e)",
    )
    p.add_argument("--label", nargs="+", default=None, help="display name per model")
    p.add_argument(
        "--model-args",
        nargs="+",
        default=None,
        metavar="KEY=VALUE",
        help="constructor overrides applied to every model (e.g. img_size=28 depth=2)",
    )


def _add_data_options(p) -> None:
    """Which images and layers, and where the results go."""
    p.add_argument("--data", default=None, help="'fmnist' (Fashion-MNIST test split) or an ImageNet-layout folder")
    p.add_argument(
        "--layers",
        nargs="+",
        default=None,
        metavar="LAYER",
        help="attention layers: indices (negative from the end) or name patterns "
        "(default all; attention-maps: the last)",
    )
    p.add_argument("--out", default=None, help="output folder (default analysis/<analysis>)")
    p.add_argument(
        "--num-images",
        type=int,
        default=None,
        help="first N images of the data (0: all; more than it holds is refused; default confusion/locality "
        "500, attention-maps 4, masking all, each at most the data's)",
    )
    p.add_argument(
        "--images",
        nargs="+",
        type=int,
        default=None,
        metavar="INDEX",
        help="analyse exactly these images (indices into the data) instead of the first N",
    )
    p.add_argument("--batch-size", type=int, default=None, help="images per forward pass (default 64)")


def _add_analysis_options(p) -> None:
    """Settings of single analyses."""
    p.add_argument(
        "--queries",
        nargs="+",
        default=None,
        help="attention-maps: query positions as row,col fractions of the image, or 'cls' (default 0.5,0.5)",
    )
    p.add_argument("--ks", nargs="+", type=int, default=None, help="masking: odd window sizes k (default 3 5 7)")
    p.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="confusion / injectivity: rows are equal when no weight differs by more than rtol/N (default 1e-3)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="masking / injectivity: seed of the random masks and constructed queries (default 0); "
        "with --runs also the seed of the runs",
    )


def _kind_runs(args) -> Optional[dict]:
    """{kind: trained model} of --runs (part d's runs) or of --kinds with --checkpoint; None when the
    kinds are built from --model."""
    from ..analysis.compare_kinds import check_kinds

    if args.runs:
        if args.model or args.checkpoint or args.label or args.model_args:
            raise ValueError("--runs has each kind's trained model: no --model/--checkpoint/--label/--model-args")
        from ..experiments.ablations import part_d_runs

        seed = (args.seed or 0) if args.run_seed is None else args.run_seed
        if seed < 0:
            raise ValueError(f"--run-seed must be >= 0, got {seed}")
        return part_d_runs(args.runs, args.kinds, seed=seed)
    if args.checkpoint:
        if args.label or args.model_args:
            raise ValueError("--kinds with --checkpoint labels each model by its kind: give no --label / --model-args")
        kinds = check_kinds(args.kinds)
        if len(args.checkpoint) != len(kinds) or len(set(kinds)) != len(kinds):
            raise ValueError(
                f"--kinds with --checkpoint: one checkpoint per kind, each kind once (got {len(kinds)} kinds, "
                f"{len(args.checkpoint)} checkpoints)"
            )
        return dict(zip(kinds, args.checkpoint))
    if not args.model or len(args.model) != 1 or args.label:
        raise ValueError(
            "--kinds builds one model per kind from a single --model NAME (random init; no --label), "
            "or takes one --checkpoint per kind, or the trained part-d models of --runs FOLDER"
        )
    return None


def _models(args) -> Optional[list]:
    """The models the options name (None: injectivity's constructed queries need none)."""
    from ..analysis.analyze import load_kind_models, load_models
    from ..analysis.common import parse_model_args

    if args.run_seed is not None and not args.runs:
        raise ValueError(f"--run-seed {args.run_seed} picks the runs of --runs FOLDER: give --runs, or no --run-seed")
    if args.analysis == "injectivity" and not (args.runs or args.kinds and args.checkpoint):
        if args.model or args.checkpoint or args.label or args.model_args:
            raise ValueError("injectivity of fresh layers takes no --model/--checkpoint/--label/--model-args")
        return None
    model_args = parse_model_args(args.model_args)
    if args.kinds or args.runs:
        runs = _kind_runs(args)
        return load_kind_models(
            args.analysis, args.kinds, name=args.model and args.model[0], runs=runs, model_args=model_args
        )
    return load_models(args.model, args.checkpoint, labels=args.label, model_args=model_args)


def run(args) -> int:
    from ..analysis.analyze import describe_result, run_analysis

    out = pathlib.Path(writable_dir(args.out or pathlib.Path("analysis") / args.analysis, "--out"))
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0, got {args.threads}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    options = {key: getattr(args, key) for key in OPTION_ANALYSES}
    if args.runs and args.analysis not in OPTION_ANALYSES["seed"]:
        options["seed"] = None  # it picked the runs; this analysis draws nothing from it
    check_options(args.analysis, **options)  # before the models are loaded
    written = run_analysis(
        args.analysis,
        out,
        models=_models(args),
        kinds=args.kinds,
        layers=args.layers,
        progress=not args.no_progress,
        **options,
    )
    print(describe_result(args.analysis, out, written))
    return 0


__all__ = ["register", "run"]
