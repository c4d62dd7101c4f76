"""``inline-attn analyze <analysis>``: the paper's analyses from the command line.

Each command writes its numbers (CSV and/or JSON) and PNG figures into ``--out``.
"""

from __future__ import annotations

import json
import pathlib
from typing import Optional

from .._io import writable_dir
from ..runtime.report import write_csv

ANALYSES = ("injectivity", "confusion", "attention-maps", "locality", "masking")
_DEFAULT_IMAGES = {"confusion": 500, "attention-maps": 4, "locality": 500, "masking": 0}


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
        help="first N images of the data (0: all; default confusion/locality 500, attention-maps 4, masking all)",
    )
    p.add_argument(
        "--images",
        nargs="+",
        type=int,
        default=None,
        metavar="INDEX",
        help="analyse exactly these images (indices into the data) instead of the first N",
    )
    p.add_argument("--batch-size", type=int, default=64)


def _add_analysis_options(p) -> None:
    """Settings of single analyses."""
    p.add_argument(
        "--queries",
        nargs="+",
        default=["0.5,0.5"],
        help="attention-maps: query positions as row,col fractions of the image, or 'cls'",
    )
    p.add_argument("--ks", nargs="+", type=int, default=[3, 5, 7], help="masking: window sizes k")
    p.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="confusion / injectivity: rows are equal when no weight differs by more than rtol/N (default 1e-3)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random masks and constructed queries")


def _parse_layers(items: Optional[list]) -> Optional[list]:
    if not items:
        return None
    out = []
    for it in items:
        try:
            out.append(int(it))
        except ValueError:
            out.append(it)
    return out


def _load_models(args) -> list:
    from ..analysis.common import load_model, parse_model_args

    if args.kinds or args.runs:
        return _kind_models(args)
    names, ckpts = args.model, args.checkpoint
    if not names and not ckpts:
        raise ValueError(f"analyze {args.analysis} needs --model NAME (and/or --checkpoint PATH)")
    n = max(len(names or []), len(ckpts or []))
    if names and len(names) not in (1, n) or ckpts and len(ckpts) not in (1, n):
        raise ValueError(
            f"got {len(names or [])} --model and {len(ckpts or [])} --checkpoint values: "
            "give one of each per model (or a single one shared by all)"
        )
    if args.label and len(args.label) != n:
        raise ValueError(f"got {len(args.label)} --label values for {n} models")
    kw = parse_model_args(args.model_args)
    models = []
    for i in range(n):
        name = (names[i] if len(names) > 1 else names[0]) if names else None
        ck = (ckpts[i] if len(ckpts) > 1 else ckpts[0]) if ckpts else None
        ck = None if ck is not None and ck.lower() == "none" else ck
        label = args.label[i] if args.label else None
        if label is None and ck is not None and (pathlib.Path(ck).is_dir() or n > 1):
            label = pathlib.Path(ck).name if pathlib.Path(ck).is_dir() else pathlib.Path(ck).stem
        models.append(load_model(name, ck, model_args=kw, label=label))
    labels = [m.label for m in models]
    if len(set(labels)) != len(labels):
        for i, m in enumerate(models):
            m.label = f"{m.label} [{i}]"
    return models


def _kind_models(args) -> list:
    """One model per attention kind: built from --model (random init), or trained (--checkpoint per
    kind, or the part-d runs in --runs)."""
    from ..analysis.common import parse_model_args
    from ..analysis.compare_kinds import check_kinds, kind_models, split_by_weights, trained_kind_models

    if args.runs:
        if args.model or args.checkpoint or args.label:
            raise ValueError(
                "--runs finds each kind's trained model in the folder: give no --model / --checkpoint / --label"
            )
        from ..experiments.ablations import part_d_runs

        seed = args.seed if args.run_seed is None else args.run_seed
        if seed < 0:
            raise ValueError(f"--run-seed must be >= 0, got {seed}")
        runs = part_d_runs(args.runs, args.kinds, seed=seed)
    elif args.checkpoint:
        if args.label or args.model_args:
            raise ValueError("--kinds with --checkpoint labels each model by its kind: give no --label / --model-args")
        kinds = check_kinds(args.kinds)
        if len(args.checkpoint) != len(kinds) or len(set(kinds)) != len(kinds):
            raise ValueError(
                f"--kinds with --checkpoint: one checkpoint per kind, each kind once (got {len(kinds)} kinds, "
                f"{len(args.checkpoint)} checkpoints)"
            )
        runs = dict(zip(kinds, args.checkpoint))
    else:
        runs = None
        if not args.model or len(args.model) != 1 or args.label:
            raise ValueError(
                "--kinds builds one model per kind from a single --model NAME (random init; no --label), "
                "or takes one --checkpoint per kind, or the trained part-d models of --runs FOLDER"
            )
    kinds, message = split_by_weights(list(runs) if runs else args.kinds, args.analysis)
    if message:
        print(message)
    if not kinds:
        raise ValueError(message)
    if runs is not None:
        return trained_kind_models({k: runs[k] for k in kinds})
    return kind_models(args.model[0], kinds, parse_model_args(args.model_args))


def _check_layers(models, layers) -> None:
    from ..layers.record import attention_layers, select_layers

    for lm in models:
        try:
            select_layers(attention_layers(lm.model), layers)
        except ValueError as e:
            raise ValueError(f"model {lm.label}: {e}") from None


def _write_meta(path: pathlib.Path, args, models, **results) -> None:
    """The run's JSON: what was analysed (command arguments, models) plus ``results``."""
    meta = {
        "analysis": args.analysis,
        "data": args.data,
        "layers": args.layers,
        "models": [{"label": m.label, "name": m.name, "checkpoint": m.checkpoint, "kwargs": m.kwargs} for m in models],
        **results,
    }
    path.write_text(json.dumps(meta, indent=1))


def run(args) -> int:
    out = pathlib.Path(writable_dir(args.out or pathlib.Path("analysis") / args.analysis, "--out"))
    progress = not args.no_progress
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0, got {args.threads}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.analysis == "injectivity":
        return _injectivity_kinds(args, out) if args.kinds or args.runs else _injectivity(args, out)
    models = _load_models(args)
    layers = _parse_layers(args.layers)
    if args.analysis == "attention-maps" and layers is not None and len(layers) != 1:
        raise ValueError(f"attention-maps takes one layer, got --layers {args.layers}")
    _check_layers(models, layers)
    if args.data is None:
        raise ValueError(f"analyze {args.analysis} needs --data (fmnist or an ImageNet-layout folder)")
    from ..analysis.common import load_images

    n_img = _DEFAULT_IMAGES[args.analysis] if args.num_images is None else args.num_images
    if n_img < 0:
        raise ValueError(f"--num-images must be >= 0, got {n_img}")
    first = models[0]
    images = load_images(
        args.data,
        num_images=n_img,
        img_size=first.img_size[0],
        indices=args.images,
        crop_pct=first.crop_pct,
        interpolation=first.interpolation,
    )
    fn = {"confusion": _confusion, "attention-maps": _attention_maps, "locality": _locality, "masking": _masking}[
        args.analysis
    ]
    written = fn(args, out, models, images, layers, progress)
    print(f"wrote {', '.join(written)} to {out}")
    return 0


def _injectivity(args, out: pathlib.Path) -> int:
    from ..analysis.confusion import DEFAULT_RTOL
    from ..analysis.injectivity import injectivity, plot_injectivity, to_json

    res = injectivity(seed=args.seed, rtol=args.rtol if args.rtol is not None else DEFAULT_RTOL)
    (out / "injectivity.json").write_text(json.dumps(to_json(res), indent=1))
    plot_injectivity(res, out / "injectivity.png")
    rows = [
        {
            "queries": fam,
            "attention": kind,
            "distinct_rows": r["distinct_rows"],
            "queries_total": len(r["weights"]),
            "confused_pairs": r["confused_pairs"],
        }
        for fam, d in res["results"].items()
        for kind, r in d.items()
    ]
    write_csv(rows, out / "injectivity.csv")
    print(f"wrote injectivity.csv, injectivity.json, injectivity.png to {out}")
    return 0


def _injectivity_kinds(args, out: pathlib.Path) -> int:
    from ..analysis.compare_kinds import (
        injectivity_by_kind,
        injectivity_of_models,
        injectivity_table,
        plot_injectivity_by_kind,
        split_by_weights,
    )
    from ..analysis.confusion import DEFAULT_RTOL

    rtol = args.rtol if args.rtol is not None else DEFAULT_RTOL
    note = ""
    if args.runs or args.checkpoint:  # trained models: one attention layer of each, as trained
        models = _kind_models(args)
        layers = _parse_layers(args.layers)
        if layers is not None and len(layers) != 1:
            raise ValueError(f"injectivity of trained models takes one layer, got --layers {args.layers}")
        res = injectivity_of_models(models, layer=layers[0] if layers else 0, seed=args.seed, rtol=rtol)
        n, d = res["problem"]["keys"].shape
        names = set(res["layers"].values())
        where = (
            f"layer {names.pop()} of each"
            if len(names) == 1
            else "; ".join(f"{k}: {v}" for k, v in res["layers"].items())
        )
        note = (
            f"\nTrained models: one attention layer ({where}) with its parameters as trained, without InLine's "
            f"local residual; {n} keys of width {d}, seed {args.seed}.\n"
        )
        _write_meta(out / "injectivity_kinds.json", args, models, layers_tested=res["layers"], results=_rows_json(res))
    else:
        kinds, message = split_by_weights(args.kinds, "injectivity")
        if message:
            print(message)
        res = injectivity_by_kind(kinds, seed=args.seed, rtol=rtol)
    (out / "injectivity_kinds.md").write_text(injectivity_table(res) + note)
    plot_injectivity_by_kind(res, out / "injectivity_kinds.png")
    print(f"wrote injectivity_kinds.md, injectivity_kinds.png to {out}")
    return 0


def _rows_json(res: dict) -> dict:
    """{label: {family: {"distinct_rows", "confused_pairs"}}} of an injectivity result."""
    return {
        label: {fam: {k: int(r[k]) for k in ("distinct_rows", "confused_pairs")} for fam, r in fams.items()}
        for label, fams in res["results"].items()
    }


def _confusion(args, out, models, images, layers, progress) -> list[str]:
    from ..analysis.common import ImageBatches
    from ..analysis.compare_kinds import confusion_table
    from ..analysis.confusion import DEFAULT_RTOL, confusion_counts, plot_confusion_histogram, summarize

    rtol = args.rtol if args.rtol is not None else DEFAULT_RTOL
    rows, summary, totals = [], {}, {}
    for lm in models:
        res = confusion_counts(
            lm.model,
            ImageBatches(images, lm, args.batch_size),
            layers=layers,
            rtol=rtol,
            progress=progress,
            desc=f"confusion {lm.label}",
        )
        counts = res["counts"]
        for img in range(counts.shape[0]):
            row = {"model": lm.label, "image": img}
            row.update({f"layer{i}": int(counts[img, j]) for j, (i, _) in enumerate(res["layers"])})
            row["total"] = int(counts[img].sum())
            rows.append(row)
        s = summarize(counts, res["pairs"])
        s["per_layer_mean"] = {name: float(counts[:, j].double().mean()) for j, (_, name) in enumerate(res["layers"])}
        summary[lm.label] = s
        totals[lm.label] = counts.sum(dim=1).numpy()
    write_csv(rows, out / "confusion.csv")
    _write_meta(
        out / "confusion.json",
        args,
        models,
        definition="pairs of different queries (same image, layer, head, window) whose weight "
        "rows differ by at most rtol / N_keys in every entry",
        rtol=rtol,
        images=int(len(images.labels)),
        summary=summary,
    )
    plot_confusion_histogram(totals, out / "confusion.png")
    (out / "confusion.md").write_text(confusion_table(summary, _kinds_of(models)))
    return ["confusion.csv", "confusion.json", "confusion.md", "confusion.png"]


def _kinds_of(models) -> dict:
    from ..analysis.compare_kinds import model_kind

    return {lm.label: model_kind(lm.model) for lm in models}


def _measure_each(name: str, args, out, models, images, measure) -> dict:
    """``measure(model, batches, desc)`` for every model -> {label: results}; the rows go to
    ``out/<name>.csv`` (one per result, with the model's label) and the results to ``<name>.json``."""
    from ..analysis.common import ImageBatches

    per_model, rows = {}, []
    for lm in models:
        res = measure(lm.model, ImageBatches(images, lm, args.batch_size), f"{name} {lm.label}")
        per_model[lm.label] = res
        rows += [{"model": lm.label, **r} for r in res]
    write_csv(rows, out / f"{name}.csv")
    _write_meta(out / f"{name}.json", args, models, images=int(len(images.labels)), results=per_model)
    return per_model


def _locality(args, out, models, images, layers, progress) -> list[str]:
    from ..analysis.compare_kinds import locality_table
    from ..analysis.locality import locality, plot_locality

    per_model = _measure_each(
        "locality",
        args,
        out,
        models,
        images,
        lambda model, batches, desc: locality(model, batches, layers=layers, progress=progress, desc=desc),
    )
    plot_locality(per_model, out / "locality.png")
    (out / "locality.md").write_text(locality_table(per_model, _kinds_of(models)))
    return ["locality.csv", "locality.json", "locality.md", "locality.png"]


def _masking(args, out, models, images, layers, progress) -> list[str]:
    from ..analysis.compare_kinds import masking_note
    from ..analysis.masking import masked_accuracy, plot_masking

    for k in args.ks:
        if k < 1 or k % 2 == 0:
            raise ValueError(f"--ks: window size {k} must be an odd positive integer")

    def measure(model, batches, desc):
        return masked_accuracy(model, batches, ks=args.ks, layers=layers, seed=args.seed, progress=progress, desc=desc)

    per_model = _measure_each("masking", args, out, models, images, measure)
    (out / "masking.md").write_text(masking_table(per_model, args.ks) + masking_note(_kinds_of(models)))
    plot_masking(per_model, args.ks, out / "masking.png")
    return ["masking.csv", "masking.json", "masking.md", "masking.png"]


def masking_table(per_model: dict, ks) -> str:
    """Markdown table: model | no mask | local kxk | random kxk ... (top-1 %)."""
    head = ["model", "no mask"] + [f"{m} {k}x{k}" for k in ks for m in ("local", "random")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, rows in per_model.items():
        by = {(r["mask"], r["k"]): r["top1"] for r in rows}
        cells = [label, f"{by[('none', 0)]:.2f}"] + [f"{by[(m, k)]:.2f}" for k in ks for m in ("local", "random")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _attention_maps(args, out, models, images, layers, progress) -> None:
    from ..analysis.attention_maps import attention_maps, parse_query, plot_attention_maps
    from ..analysis.common import ImageBatches, display_images

    queries = [parse_query(q) for q in args.queries]
    layer = layers[0] if layers else -1
    per_model, meta_rows = {}, []
    shown = display_images(images.images, models[0])
    for lm in models:
        if "cls" in queries and getattr(lm.model, "num_prefix_tokens", 0) == 0:
            raise ValueError(f"model {lm.label} has no cls token: drop 'cls' from --queries")
        res = attention_maps(
            lm.model,
            ImageBatches(images, lm, args.batch_size),
            queries,
            layer=layer,
            progress=progress,
            desc=f"attention maps {lm.label}",
        )
        per_model[lm.label] = res
        for i in range(res["maps"].shape[0]):
            for qi, q in enumerate(queries):
                meta_rows.append(
                    {
                        "model": lm.label,
                        "layer": res["layer"],
                        "image": i,
                        "label": int(images.labels[i]),
                        "query": q if q == "cls" else list(q),
                        "cls_weight": float(res["cls_weight"][i, qi]),
                        "map": res["maps"][i, qi].tolist(),
                    }
                )
    for qi, q in enumerate(queries):
        plot_attention_maps(
            shown, {lab: r["maps"][:, qi] for lab, r in per_model.items()}, q, out / f"attention_maps_q{qi}.png"
        )
    _write_meta(
        out / "attention_maps.json",
        args,
        models,
        images=int(len(images.labels)),
        queries=[q if q == "cls" else list(q) for q in queries],
        maps=meta_rows,
    )
    return ["attention_maps.json"] + [f"attention_maps_q{qi}.png" for qi in range(len(queries))]


__all__ = ["ANALYSES", "register", "run", "masking_table"]
