"""One analysis from names and paths: pick the models and images, then write the files.

:func:`run_analysis` is what ``inline-attn analyze`` calls; its keywords are the command's options.
The models are registered names and/or checkpoints (:func:`load_models`), or one model per
attention kind (:func:`load_kind_models`); the writers are in :mod:`.report`.
"""

from __future__ import annotations

import pathlib
from typing import Mapping, Optional, Sequence

from .common import LoadedModel, PathLike
from .confusion import DEFAULT_RTOL
from .report import (
    parse_layers,
    write_attention_maps,
    write_confusion,
    write_injectivity,
    write_injectivity_kinds,
    write_locality,
    write_masking,
)

ANALYSES = ("injectivity", "confusion", "attention-maps", "locality", "masking")
DEFAULT_IMAGES = {"confusion": 500, "attention-maps": 4, "locality": 500, "masking": 0}
_ON_IMAGES = ("confusion", "attention-maps", "locality", "masking")
# option -> the analyses that read it; given (not None) to any other analysis, it is refused
OPTION_ANALYSES = {
    "data": _ON_IMAGES,
    "num_images": _ON_IMAGES,
    "images": _ON_IMAGES,
    "batch_size": _ON_IMAGES,
    "queries": ("attention-maps",),
    "ks": ("masking",),
    "rtol": ("confusion", "injectivity"),
    "seed": ("injectivity", "masking"),
}


def load_models(
    names: Optional[Sequence[str]],
    checkpoints: Optional[Sequence[Optional[str]]] = None,
    *,
    labels: Optional[Sequence[str]] = None,
    model_args: Optional[dict] = None,
) -> list[LoadedModel]:
    """One model per name and/or checkpoint (a single one is shared by all; checkpoint ``"none"``:
    random init). A checkpoint's model is labelled by its run folder or file name when there are
    several; repeated labels get `` [i]``."""
    from .common import load_model

    if not names and not checkpoints:
        raise ValueError("no models: give --model NAME (and/or --checkpoint PATH)")
    n = max(len(names or []), len(checkpoints or []))
    if names and len(names) not in (1, n) or checkpoints and len(checkpoints) not in (1, n):
        raise ValueError(
            f"got {len(names or [])} --model and {len(checkpoints or [])} --checkpoint values: "
            "give one of each per model (or a single one shared by all)"
        )
    if labels and len(labels) != n:
        raise ValueError(f"got {len(labels)} --label values for {n} models")
    models = []
    for i in range(n):
        name = (names[i] if len(names) > 1 else names[0]) if names else None
        ck = (checkpoints[i] if len(checkpoints) > 1 else checkpoints[0]) if checkpoints else None
        ck = None if ck is not None and str(ck).lower() == "none" else ck
        label = labels[i] if labels else None
        if label is None and ck is not None and (pathlib.Path(ck).is_dir() or n > 1):
            label = pathlib.Path(ck).name if pathlib.Path(ck).is_dir() else pathlib.Path(ck).stem
        models.append(load_model(name, ck, model_args=model_args or {}, label=label))
    labels_now = [m.label for m in models]
    if len(set(labels_now)) != len(labels_now):
        for i, m in enumerate(models):
            m.label = f"{m.label} [{i}]"
    return models


def load_kind_models(
    analysis: str,
    kinds: Optional[Sequence[str]],
    *,
    name: Optional[str] = None,
    runs: Optional[Mapping[str, PathLike]] = None,
    model_args: Optional[dict] = None,
) -> list[LoadedModel]:
    """One model per attention kind: trained (``runs``: {kind: checkpoint or run folder}) or model
    ``name`` built with every stage of that kind (random init). Kinds without explicit weights are
    left out of the analyses that need them, with a printed note."""
    from .compare_kinds import kind_models, split_by_weights, trained_kind_models

    kinds, message = split_by_weights(list(runs) if runs else kinds, analysis)
    if message:
        print(message)
    if not kinds:
        raise ValueError(message)
    if runs is not None:
        return trained_kind_models({k: runs[k] for k in kinds})
    return kind_models(name, kinds, model_args or {})


def _check_layers(models: Sequence[LoadedModel], layers) -> None:
    from ..layers.record import attention_layers, select_layers

    for lm in models:
        try:
            select_layers(attention_layers(lm.model), layers)
        except ValueError as e:
            raise ValueError(f"model {lm.label}: {e}") from None


def check_options(analysis: str, **options) -> None:
    """Refuse the options (keyword -> value; None: not given) that ``analysis`` would ignore, and
    values it would fail on only after the models and images are loaded."""
    for key, value in options.items():
        if value is not None and analysis not in OPTION_ANALYSES[key]:
            raise ValueError(
                f"--{key.replace('_', '-')} is an option of {', '.join(OPTION_ANALYSES[key])}: "
                f"analyze {analysis} does not take it"
            )
    if options.get("num_images") is not None and options.get("images") is not None:
        raise ValueError("--images names the images: give no --num-images with it")
    if options.get("num_images") is not None and options["num_images"] < 0:
        raise ValueError(f"--num-images must be >= 0 (0: all), got {options['num_images']}")
    if options.get("batch_size") is not None and options["batch_size"] < 1:
        raise ValueError(f"--batch-size must be >= 1, got {options['batch_size']}")
    rtol = options.get("rtol")
    if rtol is not None and not (0 <= rtol < float("inf")):
        raise ValueError(f"--rtol must be a finite number >= 0, got {rtol}")
    from .masking import check_odd_window_sizes

    check_odd_window_sizes(options.get("ks") or (), "--ks")
    if options.get("queries") is not None:
        from .attention_maps import parse_query

        for q in options["queries"]:
            parse_query(q)


def run_analysis(
    analysis: str,
    out: PathLike,
    *,
    models: Optional[Sequence[LoadedModel]] = None,
    kinds: Optional[Sequence[str]] = None,
    data: Optional[str] = None,
    layers: Optional[Sequence] = None,
    num_images: Optional[int] = None,
    images: Optional[Sequence[int]] = None,
    batch_size: Optional[int] = None,
    queries: Optional[Sequence[str]] = None,
    ks: Optional[Sequence[int]] = None,
    rtol: Optional[float] = None,
    seed: Optional[int] = None,
    progress: bool = True,
) -> list[pathlib.Path]:
    """Run ``analysis`` (one of :data:`ANALYSES`) on ``models`` over the images of ``data`` (the first
    ``num_images``, default :data:`DEFAULT_IMAGES`, or exactly ``images``) and write its files into
    ``out``; returns their paths. Injectivity takes no data: the constructed queries through each of
    ``kinds`` (or through the trained ``models``), or through linear and InLine attention.

    An option left None takes its default (``batch_size`` 64, ``queries`` the centre "0.5,0.5",
    ``ks`` 3 5 7, ``rtol`` 1e-3, ``seed`` 0); one given to an analysis that does not read it (see
    :data:`OPTION_ANALYSES`) is refused, as are ``layers`` for injectivity without trained models."""
    if analysis not in ANALYSES:
        raise ValueError(f"unknown analysis {analysis!r}: expected one of {list(ANALYSES)}")
    check_options(
        analysis,
        data=data,
        num_images=num_images,
        images=images,
        batch_size=batch_size,
        queries=queries,
        ks=ks,
        rtol=rtol,
        seed=seed,
    )
    rtol = DEFAULT_RTOL if rtol is None else rtol
    seed = 0 if seed is None else seed
    if analysis == "injectivity":
        if models is None and layers:
            raise ValueError("--layers picks the layer of trained models: injectivity of fresh layers takes none")
        if models is None and not kinds:
            return write_injectivity(out, seed=seed, rtol=rtol)
        if models is None:
            from .compare_kinds import split_by_weights

            kinds, message = split_by_weights(kinds, analysis)
            if message:
                print(message)
        return write_injectivity_kinds(out, kinds=kinds, models=models, layers=layers, seed=seed, rtol=rtol)
    return _run_on_images(
        analysis,
        out,
        models,
        data,
        layers,
        num_images=num_images,
        images=images,
        batch_size=64 if batch_size is None else batch_size,
        queries=("0.5,0.5",) if queries is None else queries,
        ks=(3, 5, 7) if ks is None else ks,
        rtol=rtol,
        seed=seed,
        progress=progress,
    )


def _run_on_images(analysis, out, models, data, layers, *, num_images, images, batch_size, **options):
    """The analyses that run ``models`` over images (all but injectivity)."""
    if not models:
        raise ValueError(f"analyze {analysis} needs models")
    chosen = parse_layers(layers)
    if analysis == "attention-maps" and chosen is not None and len(chosen) != 1:
        raise ValueError(f"attention-maps takes one layer, got --layers {list(layers)}")
    _check_layers(models, chosen)
    if data is None:
        raise ValueError(f"analyze {analysis} needs --data (fmnist or an ImageNet-layout folder)")
    from .common import load_images

    n_img = DEFAULT_IMAGES[analysis] if num_images is None else num_images
    first = models[0]
    image_set = load_images(
        data,
        num_images=n_img,
        setting=None if num_images is None else "--num-images",  # a default takes what the data has
        img_size=first.img_size[0],
        indices=images,
        crop_pct=first.crop_pct,
        interpolation=first.interpolation,
    )
    common = dict(layers=layers, batch_size=batch_size, progress=options["progress"], data=data)
    if analysis == "confusion":
        return write_confusion(models, image_set, out, rtol=options["rtol"], **common)
    if analysis == "locality":
        return write_locality(models, image_set, out, **common)
    if analysis == "masking":  # scores the labels: each model's head must fit the data's classes
        from ..data import check_class_count

        for m in models:
            if image_set.num_classes is not None:
                check_class_count(
                    m.model.num_classes,
                    image_set.num_classes,
                    model=f"model {m.label}: num_classes",
                    data=f"--data {data}",
                )
        return write_masking(models, image_set, out, ks=options["ks"], seed=options["seed"], **common)
    return write_attention_maps(models, image_set, out, queries=options["queries"], **common)


__all__ = [
    "ANALYSES",
    "DEFAULT_IMAGES",
    "OPTION_ANALYSES",
    "check_options",
    "run_analysis",
    "load_kind_models",
    "load_models",
]


def describe_result(analysis: str, out, written) -> str:
    """What ``inline-attn analyze`` prints when done: the headline number per model
    (:func:`~inline_attn.analysis.report.headline`), then the files written."""
    from .report import headline

    try:
        first = headline(analysis, out)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):  # a layout without a headline of its own
        first = None
    lines = [first, f"wrote {', '.join(pathlib.Path(p).name for p in written)} to {out}"]
    return "\n".join(line for line in lines if line)
