"""The analyses' output files: one ``write_<analysis>`` per analysis, each returning the paths it wrote.

``inline-attn analyze`` calls these (through :func:`inline_attn.analysis.analyze.run_analysis`), so a Python
caller gets the same CSV, JSON, Markdown and PNG files as the command. Each data-driven analysis
writes ``<name>.json`` with what was analysed (data, layers as given, the models) beside its results.
The writers create ``out`` when it does not exist.
"""

from __future__ import annotations

import json
import pathlib
from typing import Optional, Sequence

from .._io import atomic_write_text
from ..runtime.report import markdown_table, write_csv, write_json
from .common import ImageBatches, ImageSet, LoadedModel, PathLike
from .confusion import DEFAULT_RTOL


def parse_layers(items: Optional[Sequence]) -> Optional[list]:
    """Layer selectors as given (``["-1", "blocks.0*"]``) -> indices and name patterns (None: all)."""
    if not items:
        return None
    out = []
    for it in items:
        try:
            out.append(int(it))
        except ValueError:
            out.append(it)
    return out


def _folder(out: PathLike) -> pathlib.Path:
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _write_meta(path: pathlib.Path, analysis: str, data, layers, models: Sequence[LoadedModel], **results) -> None:
    """The run's JSON: what was analysed (data, layers as given, models) plus ``results``."""
    meta = {
        "analysis": analysis,
        "data": data,
        "layers": None if layers is None else list(layers),
        "models": [{"label": m.label, "name": m.name, "checkpoint": m.checkpoint, "kwargs": m.kwargs} for m in models],
        **results,
    }
    write_json(meta, path)


def _kinds_of(models: Sequence[LoadedModel]) -> dict:
    from .compare_kinds import model_kind

    return {lm.label: model_kind(lm.model) for lm in models}


def write_injectivity(out: PathLike, *, seed: int = 0, rtol: float = DEFAULT_RTOL) -> list[pathlib.Path]:
    """Fig. 1's constructed queries through linear and InLine attention: ``injectivity.csv`` (distinct
    weight rows per query family and kind), ``.json`` (every weight row) and ``.png``."""
    from .injectivity import injectivity, plot_injectivity, to_json

    out = _folder(out)
    res = injectivity(seed=seed, rtol=rtol)
    write_json(to_json(res), out / "injectivity.json")
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
    return [out / f"injectivity.{ext}" for ext in ("csv", "json", "png")]


def write_injectivity_kinds(
    out: PathLike,
    *,
    kinds: Optional[Sequence[str]] = None,
    models: Optional[Sequence[LoadedModel]] = None,
    layers: Optional[Sequence] = None,
    data=None,
    seed: int = 0,
    rtol: float = DEFAULT_RTOL,
) -> list[pathlib.Path]:
    """The constructed queries through each attention kind's layer: ``kinds`` (fresh layers) or the
    trained ``models`` (one attention layer of each, the first of ``layers`` or layer 0, plus
    ``injectivity_kinds.json``); ``injectivity_kinds.md`` and ``.png`` either way."""
    from .compare_kinds import injectivity_by_kind, injectivity_of_models, injectivity_table, plot_injectivity_by_kind

    out = _folder(out)
    written, note = [], ""
    if models is not None:
        chosen = parse_layers(layers)
        if chosen is not None and len(chosen) != 1:
            raise ValueError(f"injectivity of trained models takes one layer, got --layers {list(layers)}")
        res = injectivity_of_models(models, layer=chosen[0] if chosen else 0, seed=seed, rtol=rtol)
        n, d = res["problem"]["keys"].shape
        names = set(res["layers"].values())
        where = (
            f"layer {names.pop()} of each"
            if len(names) == 1
            else "; ".join(f"{k}: {v}" for k, v in res["layers"].items())
        )
        note = (
            f"\nTrained models: one attention layer ({where}) with its parameters as trained, without InLine's "
            f"local residual; {n} keys of width {d}, seed {seed}.\n"
        )
        rows = {
            label: {fam: {k: int(r[k]) for k in ("distinct_rows", "confused_pairs")} for fam, r in fams.items()}
            for label, fams in res["results"].items()
        }
        _write_meta(
            out / "injectivity_kinds.json",
            "injectivity",
            data,
            layers,
            models,
            layers_tested=res["layers"],
            results=rows,
        )
        written.append(out / "injectivity_kinds.json")
    else:
        res = injectivity_by_kind(kinds, seed=seed, rtol=rtol)
    atomic_write_text((out / "injectivity_kinds.md"), injectivity_table(res) + note)
    plot_injectivity_by_kind(res, out / "injectivity_kinds.png")
    return [out / "injectivity_kinds.md", out / "injectivity_kinds.png"] + written


def write_confusion(
    models: Sequence[LoadedModel],
    images: ImageSet,
    out: PathLike,
    *,
    layers: Optional[Sequence] = None,
    rtol: float = DEFAULT_RTOL,
    batch_size: int = 64,
    progress: bool = True,
    data=None,
) -> list[pathlib.Path]:
    """Semantic confusion (Fig. 3): ``confusion.csv`` (confused pairs per model, image and layer),
    ``.json`` (summary per model), ``.md`` (table by attention kind) and ``.png`` (histogram)."""
    from .compare_kinds import confusion_table
    from .confusion import confusion_counts, plot_confusion_histogram, summarize

    out = _folder(out)
    rows, summary, totals = [], {}, {}
    for lm in models:
        res = confusion_counts(
            lm.model,
            ImageBatches(images, lm, batch_size),
            layers=parse_layers(layers),
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
        "confusion",
        data,
        layers,
        models,
        definition="pairs of different queries (same image, layer, head, window) whose weight "
        "rows differ by at most rtol / N_keys in every entry",
        rtol=rtol,
        images=int(len(images.labels)),
        summary=summary,
    )
    plot_confusion_histogram(totals, out / "confusion.png")
    atomic_write_text((out / "confusion.md"), confusion_table(summary, _kinds_of(models)))
    return [out / f"confusion.{ext}" for ext in ("csv", "json", "md", "png")]


def _measure_each(name: str, models, images, out: pathlib.Path, batch_size: int, measure, meta: dict) -> dict:
    """``measure(model, batches, desc)`` for every model -> {label: results}; the rows go to
    ``out/<name>.csv`` (one per result, with the model's label) and the results to ``<name>.json``."""
    per_model, rows = {}, []
    for lm in models:
        res = measure(lm.model, ImageBatches(images, lm, batch_size), f"{name} {lm.label}")
        per_model[lm.label] = res
        rows += [{"model": lm.label, **r} for r in res]
    write_csv(rows, out / f"{name}.csv")
    _write_meta(out / f"{name}.json", name, models=models, images=int(len(images.labels)), results=per_model, **meta)
    return per_model


def write_locality(
    models: Sequence[LoadedModel],
    images: ImageSet,
    out: PathLike,
    *,
    layers: Optional[Sequence] = None,
    batch_size: int = 64,
    progress: bool = True,
    data=None,
) -> list[pathlib.Path]:
    """Locality (Fig. 5): attention mass in each query's k x k neighbourhood, ``locality.csv``,
    ``.json``, ``.md`` (table by attention kind) and ``.png``."""
    from .compare_kinds import locality_table
    from .locality import locality, plot_locality

    out, chosen = _folder(out), parse_layers(layers)
    per_model = _measure_each(
        "locality",
        models,
        images,
        out,
        batch_size,
        lambda model, batches, desc: locality(model, batches, layers=chosen, progress=progress, desc=desc),
        dict(data=data, layers=layers),
    )
    plot_locality(per_model, out / "locality.png")
    atomic_write_text((out / "locality.md"), locality_table(per_model, _kinds_of(models)))
    return [out / f"locality.{ext}" for ext in ("csv", "json", "md", "png")]


def write_masking(
    models: Sequence[LoadedModel],
    images: ImageSet,
    out: PathLike,
    *,
    ks: Sequence[int] = (3, 5, 7),
    layers: Optional[Sequence] = None,
    seed: int = 0,
    batch_size: int = 64,
    progress: bool = True,
    data=None,
) -> list[pathlib.Path]:
    """Local masking (Table 2): top-1 with attention kept to each query's k x k window or to a random
    set of the same size, ``masking.csv``, ``.json``, ``.md`` and ``.png``. A k that is not odd and
    positive, or wider than a masked layer's token grid (:func:`~.masking.check_window_sizes`), is
    refused before any model runs."""
    from .compare_kinds import masking_note
    from .masking import check_odd_window_sizes, check_window_sizes, masked_accuracy, plot_masking

    check_odd_window_sizes(ks, "--ks")
    chosen = parse_layers(layers)
    for lm in models:  # every model before the first one runs
        check_window_sizes(lm.model, ks, lm.img_size, layers=chosen, label=lm.label)
    out = _folder(out)

    def measure(model, batches, desc):
        return masked_accuracy(model, batches, ks=ks, layers=chosen, seed=seed, progress=progress, desc=desc)

    per_model = _measure_each("masking", models, images, out, batch_size, measure, dict(data=data, layers=layers))
    atomic_write_text((out / "masking.md"), masking_table(per_model, ks) + masking_note(_kinds_of(models)))
    plot_masking(per_model, ks, out / "masking.png")
    return [out / f"masking.{ext}" for ext in ("csv", "json", "md", "png")]


def masking_table(per_model: dict, ks) -> str:
    """Markdown table: model | no mask | local kxk | random kxk ... (top-1 %)."""
    head = ["model", "no mask"] + [f"{m} {k}x{k}" for k in ks for m in ("local", "random")]
    table = []
    for label, rows in per_model.items():
        by = {(r["mask"], r["k"]): r["top1"] for r in rows}
        table.append([label, f"{by[('none', 0)]:.2f}"] + [f"{by[(m, k)]:.2f}" for k in ks for m in ("local", "random")])
    return "\n".join(markdown_table(table, head)) + "\n"


def write_attention_maps(
    models: Sequence[LoadedModel],
    images: ImageSet,
    out: PathLike,
    *,
    queries: Sequence[str] = ("0.5,0.5",),
    layers: Optional[Sequence] = None,
    batch_size: int = 64,
    progress: bool = True,
    data=None,
) -> list[pathlib.Path]:
    """Attention maps (Fig. 4) of one layer (the one of ``layers``, default the last) for each query
    (``"row,col"`` fractions of the image, or ``"cls"``): ``attention_maps.json`` (every map) and one
    ``attention_maps_q<i>.png`` per query."""
    from .attention_maps import attention_maps, parse_query, plot_attention_maps
    from .common import display_images

    out, chosen = _folder(out), parse_layers(layers)
    if chosen is not None and len(chosen) != 1:
        raise ValueError(f"attention-maps takes one layer, got --layers {list(layers)}")
    parsed = [parse_query(q) for q in queries]
    per_model, meta_rows = {}, []
    for lm in models:
        if "cls" in parsed and getattr(lm.model, "num_prefix_tokens", 0) == 0:
            raise ValueError(f"model {lm.label} has no cls token: drop 'cls' from --queries")
        res = attention_maps(
            lm.model,
            ImageBatches(images, lm, batch_size),
            parsed,
            layer=chosen[0] if chosen else -1,
            progress=progress,
            desc=f"attention maps {lm.label}",
        )
        per_model[lm.label] = res
        meta_rows += _map_rows(lm.label, res, images, parsed)
    shown = display_images(images.images, models[0])
    pngs = [out / f"attention_maps_q{qi}.png" for qi in range(len(parsed))]
    for qi, q in enumerate(parsed):
        plot_attention_maps(shown, {lab: r["maps"][:, qi] for lab, r in per_model.items()}, q, pngs[qi])
    _write_meta(
        out / "attention_maps.json",
        "attention-maps",
        data,
        layers,
        models,
        images=int(len(images.labels)),
        queries=[q if q == "cls" else list(q) for q in parsed],
        maps=meta_rows,
    )
    return [out / "attention_maps.json"] + pngs


def _map_rows(label: str, res: dict, images: ImageSet, queries: list) -> list[dict]:
    """One JSON row per image and query of one model's :func:`attention_maps` result."""
    return [
        {
            "model": label,
            "layer": res["layer"],
            "image": i,
            "label": int(images.labels[i]),
            "query": q if q == "cls" else list(q),
            "cls_weight": float(res["cls_weight"][i, qi]),
            "map": res["maps"][i, qi].tolist(),
        }
        for i in range(res["maps"].shape[0])
        for qi, q in enumerate(queries)
    ]


__all__ = [
    "masking_table",
    "parse_layers",
    "write_attention_maps",
    "write_confusion",
    "write_injectivity",
    "write_injectivity_kinds",
    "write_locality",
    "write_masking",
]


def _per_model(results: dict, value) -> str:
    return ", ".join(f"{label} {value(rows)}" for label, rows in results.items())


def headline(analysis: str, out: PathLike) -> Optional[str]:
    """The analysis' main number per model, one line, from the ``<analysis>.json`` it wrote in ``out``
    (None for attention maps, which are pictures)."""
    path = pathlib.Path(out) / f"{analysis.replace('-', '_')}.json"
    if analysis == "attention-maps" or not path.is_file():
        return None
    data = json.loads(path.read_text())
    if analysis == "injectivity":
        parts = [
            f"{kind}: " + _per_model(by_kind, lambda r: f"{r['distinct_rows']}/{r['queries']}")
            for kind, by_kind in data["results"].items()
        ]
        return "distinct attention rows per query set (all distinct: injective here): " + "; ".join(parts)
    if analysis == "confusion":
        return "confused query pairs per image, mean: " + _per_model(data["summary"], lambda s: f"{s['mean']:.1f}")
    if analysis == "locality":
        mean = lambda rows: f"{sum(r['ratio_to_uniform'] for r in rows) / len(rows):.2f}x"  # noqa: E731
        return "weight on the 3x3 neighbourhood over a uniform map, mean over layers: " + _per_model(
            data["results"], mean
        )

    def masked(rows):
        local = max((r for r in rows if r["mask"] == "local"), key=lambda r: r["k"], default=None)
        plain = next((r for r in rows if r["mask"] == "none"), None)
        if local is None or plain is None:
            return "-"
        return f"{plain['top1']:.2f} -> {local['top1']:.2f}"

    return "top-1 without a mask -> with the widest local mask: " + _per_model(data["results"], masked)
