"""The paper's analyses across every attention kind: one comparative table (markdown) per analysis.

``inline-attn analyze <analysis> --kinds softmax linear inline hydra ...`` builds one model per
kind (``--model NAME`` with every stage of that kind, :func:`kind_models`), or takes one trained
checkpoint per kind (:func:`trained_kind_models`; ``--runs FOLDER`` finds the ablations' part-d run
of each kind), runs the analysis on each, and writes the per-model results as one table beside the
analysis' plot. The constructed injectivity problem (paper Fig. 1) runs on the attention layer of
each kind directly (:func:`injectivity_by_kind`), or on one attention layer of each trained model
with its trained parameters (:func:`injectivity_of_models`).

Every kind the library has forms explicit weights (the analyses read them through attention
hooks); :func:`split_by_weights` names the analyses a kind without them could not run, should one
be added.
"""

from __future__ import annotations

import copy
from typing import Mapping, Optional, Sequence

import torch

from .._io import save_figure
from ..layers.attention import ATTENTION_CHOICES, build_attention
from ..layers.linear_family import LINEAR_CORES, LinearCore
from ..layers.record import attention_layers, record_attention
from ..runtime.report import markdown_table
from .confusion import DEFAULT_RTOL, row_tolerance
from .injectivity import LENGTHS, constructed_problem, row_counts
from .masking import NORMALISATION

# the analyses that read explicit attention weights (every one the command runs)
WEIGHT_ANALYSES = ("injectivity", "confusion", "attention-maps", "locality", "masking")
FAMILIES = ("collinear", "shifted")


def check_kinds(kinds: Sequence[str]) -> list[str]:
    """Validate attention kind names; a ``ValueError`` lists the known ones."""
    kinds = list(kinds)
    unknown = [k for k in kinds if k not in ATTENTION_CHOICES]
    if unknown or not kinds:
        raise ValueError(f"unknown attention kind(s) {unknown}: expected some of {ATTENTION_CHOICES}")
    return kinds


def has_explicit_weights(kind: str) -> bool:
    """True when ``kind`` can hand its N x N weights to attention hooks."""
    core = LINEAR_CORES.get(kind)
    return core is None or core.weights is not LinearCore.weights


def split_by_weights(kinds: Sequence[str], analysis: str) -> tuple[list[str], Optional[str]]:
    """(kinds that can run ``analysis``, a message naming the others and what they cannot run, or None)."""
    kinds = check_kinds(kinds)
    if analysis not in WEIGHT_ANALYSES:
        return kinds, None
    without = [k for k in kinds if not has_explicit_weights(k)]
    if not without:
        return kinds, None
    msg = (
        f"attention kind(s) {without} form no explicit weights: they cannot run {', '.join(WEIGHT_ANALYSES)} "
        f"(left out of {analysis})"
    )
    return [k for k in kinds if k not in without], msg


def kind_letter(kind: str) -> str:
    """The pattern letter of ``kind`` (:data:`inline_attn.models.PATTERN_KINDS`)."""
    from ..models import PATTERN_KINDS

    return next(letter for letter, k in PATTERN_KINDS.items() if k == kind)


def kind_pattern(name: str, kind: str, model_args: Optional[dict] = None) -> str:
    """A pattern giving every stage of model ``name`` the attention ``kind`` (built on the meta
    device to count the stages of its default pattern)."""
    from ..models import create_model, pattern_stage_count

    kw = {k: v for k, v in (model_args or {}).items() if k != "pattern"}
    with torch.device("meta"):
        default = create_model(name, **kw).pattern
    return kind_letter(kind) * pattern_stage_count(default)


def kind_models(name: str, kinds: Sequence[str], model_args: Optional[dict] = None) -> list:
    """One :class:`~inline_attn.analysis.common.LoadedModel` per kind: model ``name`` (random init)
    with every stage of that kind, labelled by the kind."""
    from .common import load_model

    out = []
    for kind in check_kinds(kinds):
        kw = {**(model_args or {}), "pattern": kind_pattern(name, kind, model_args)}
        out.append(load_model(name, None, model_args=kw, label=kind))
    return out


def trained_kind_models(runs: Mapping[str, object]) -> list:
    """One :class:`~inline_attn.analysis.common.LoadedModel` per ``{kind: checkpoint or training run
    folder}``, rebuilt by the trainer's loader and labelled by the kind. A ``ValueError`` when a
    checkpoint's model attends with another kind than the one it is given for."""
    from .common import load_model

    out = []
    for kind, path in runs.items():
        check_kinds([kind])
        lm = load_model(None, path, label=kind)
        got = model_kind(lm.model)
        if got != kind:
            raise ValueError(f"checkpoint {path} is a model of attention kind {got!r}, given for {kind!r}")
        out.append(lm)
    return out


def model_kind(model: torch.nn.Module) -> str:
    """The attention kinds of a model's layers, in order of first use ("inline+softmax")."""
    seen: list[str] = []
    for _, layer in attention_layers(model):
        if layer.kind not in seen:
            seen.append(layer.kind)
    return "+".join(seen)


# --- injectivity on constructed queries, every kind ---------------------------------------------


def kind_weight_rows(kind: str, queries: torch.Tensor, keys: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Row of query token 0 for each of the M ``queries`` [M, d] over ``keys`` [N, d] (N even):
    the layer of ``kind`` (one head of width d, float64, seeded random init for its own parameters)
    through :func:`layer_weight_rows`. Returns [M, N]."""
    torch.manual_seed(seed)
    layer = build_attention(kind, queries.shape[1], 1)
    return layer_weight_rows(layer, queries, keys, seed)


def layer_weight_rows(layer: torch.nn.Module, queries: torch.Tensor, keys: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Row of query token 0 for each of the M ``queries`` [M, d] over ``keys`` [N, d] (N even) in
    ``layer``'s attention function (a float64 copy, its own parameters as they are: random or
    trained): it attends over N tokens on a 2 x N/2 grid whose query 0 is each query in turn, the
    other queries and the values fixed (seeded), without InLine's local residual. Every head of
    width d gets the same query and keys. Returns [M, heads * N] (every head's row side by side)."""
    m, d = queries.shape
    n = keys.shape[0]
    if n % 2:
        raise ValueError(f"the constructed problem lays its {n} keys on a 2 x N/2 grid: N must be even")
    heads = int(layer.num_heads)
    if getattr(layer, "head_dim", d) != d:
        raise ValueError(f"queries of width {d}: the layer's heads have width {layer.head_dim}")
    layer = copy.deepcopy(layer).double().eval()
    g = torch.Generator().manual_seed(seed)
    others = torch.randn(n, heads * d, generator=g, dtype=torch.float64)
    v = torch.randn(1, n, heads * d, generator=g, dtype=torch.float64)
    k = keys.to(torch.float64).repeat(1, heads)[None]
    rows = []
    for i in range(m):
        q = others.clone()
        q[0] = queries[i].to(torch.float64).repeat(heads)
        with torch.no_grad(), record_attention(layer) as recs:
            layer.attend_tokens(
                q[None], k, v, feat_size=(2, n // 2), feature_map=getattr(layer, "feature_map", None), scale=layer.scale
            )
        rows.append(recs[-1].weights[0, :, 0, :].reshape(-1))
    return torch.stack(rows)


def injectivity_by_kind(
    kinds: Sequence[str],
    *,
    num_keys: int = 8,
    dim: int = 4,
    lengths: Sequence[float] = LENGTHS,
    seed: int = 0,
    rtol: float = DEFAULT_RTOL,
) -> dict:
    """Paper Fig. 1's query families (:func:`~inline_attn.analysis.injectivity.constructed_problem`)
    through every kind's layer: {"problem": ..., "results": {kind: {family: {"weights": [M, heads*N],
    "distinct_rows", "confused_pairs"}}}}. Rows are equal within ``rtol / N`` in every entry."""
    kinds = check_kinds(kinds)
    prob = constructed_problem(num_keys, dim, lengths, seed)
    atol = row_tolerance(num_keys, rtol)  # per key, though a row holds every head's weights side by side
    results: dict = {}
    for kind in kinds:
        results[kind] = {}
        for fam in FAMILIES:
            results[kind][fam] = row_counts(kind_weight_rows(kind, prob[fam], prob["keys"], seed), atol=atol)
    return {"problem": prob, "results": results}


def injectivity_of_models(
    models: Sequence, *, layer=0, lengths: Sequence[float] = LENGTHS, seed: int = 0, rtol: float = DEFAULT_RTOL
) -> dict:
    """Paper Fig. 1's query families through one attention layer of each (trained) model, its own
    parameters as trained (:func:`layer_weight_rows`): the same result as
    :func:`injectivity_by_kind`, keyed by the models' labels, with "layers": {label: layer name}.
    Keys: the smallest even count (at least 8) above the layer's head width, so centred keys span it."""
    from ..layers.record import select_layers

    results, names, prob = {}, {}, None
    for lm in models:
        [(_, name, mod)] = select_layers(attention_layers(lm.model), [layer])
        d = int(mod.head_dim)
        n = max(8, 2 * (d // 2 + 1))
        prob = constructed_problem(n, d, lengths, seed)
        atol = row_tolerance(n, rtol)
        names[lm.label] = name
        results[lm.label] = {
            fam: row_counts(layer_weight_rows(mod, prob[fam], prob["keys"], seed), atol=atol) for fam in FAMILIES
        }
    if prob is None:
        raise ValueError("no models to test")
    return {"problem": prob, "results": results, "layers": names}


def injectivity_table(res: dict) -> str:
    """Markdown: kind | distinct rows of each family (of M queries) | injective on both."""
    m = len(res["problem"]["lengths"])
    columns = ["kind", f"collinear queries: distinct rows of {m}", f"shifted queries: distinct rows of {m}"]
    rows = []
    for kind, fams in res["results"].items():
        counts = [fams[f]["distinct_rows"] for f in FAMILIES]
        rows.append([kind, counts[0], counts[1], "yes" if min(counts) == m else "no"])
    return "\n".join(markdown_table(rows, columns + ["injective here"])) + "\n"


def plot_injectivity_by_kind(res: dict, path) -> None:
    """Grouped bars: distinct weight rows per kind for both query families, M marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(res["results"])
    m = len(res["problem"]["lengths"])
    fig, ax = plt.subplots(figsize=(2.6 + 0.7 * len(kinds), 3.2), dpi=100)
    for j, fam in enumerate(FAMILIES):
        xs = [i + (j - 0.5) * 0.38 for i in range(len(kinds))]
        ax.bar(xs, [res["results"][k][fam]["distinct_rows"] for k in kinds], width=0.36, label=f"{fam} queries")
    ax.axhline(m, color="k", lw=0.8, ls="--", label=f"injective ({m} of {m})")
    ax.set_xticks(range(len(kinds)))
    ax.set_xticklabels(kinds, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("distinct weight rows")
    ax.set_title("Injectivity on constructed queries, every attention kind (cf. paper Fig. 1)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, not over them
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


# --- tables of the data-driven analyses --------------------------------------------------------


def _norm_note(kind: str) -> str:
    parts = [NORMALISATION.get(k, "?") for k in kind.split("+")]
    return "no" if "none" in parts else "yes"


def confusion_table(summary: dict, kinds: dict) -> str:
    """Markdown: model | kind | images | confused query pairs per image (mean, median, max) |
    fraction of images with any | rate (confused share of the query pairs compared, where the
    summary has it) | mean per layer (where the summary has it). ``summary``: {label:
    :func:`~.confusion.summarize` dict, optionally with ``per_layer_mean`` {layer: mean}};
    ``kinds``: {label: kind}."""
    columns = ["model", "kind", "images", "confused pairs / image: mean", "median", "max", "images with any"]
    columns += ["rate (of pairs compared)", "mean per layer"]
    rows = []
    for label, s in summary.items():
        if not s.get("images"):
            rows.append([label, kinds[label], 0] + ["-"] * 6)
            continue
        rate = f"{100 * s['rate']:.3g}%" if "rate" in s else "-"
        per_layer = " / ".join(f"{v:.1f}" for v in (s.get("per_layer_mean") or {}).values()) or "-"
        counts = [s["images"], f"{s['mean']:.1f}", f"{s['median']:.0f}", f"{s['max']:.0f}"]
        rows.append([label, kinds[label], *counts, f"{100 * s['frac_images_confused']:.0f}%", rate, per_layer])
    return "\n".join(markdown_table(rows, columns)) + "\n"


def locality_table(per_model: dict, kinds: dict) -> str:
    """Markdown: model | kind | 3x3-neighbourhood mass (mean over layers) | uniform | ratio |
    ratio per layer (first to last) | rows sum to one. A kind whose rows do not sum to one
    (:data:`~.masking.NORMALISATION` "none") has a mass that is not a share of its attention:
    compare it with care."""
    columns = ["model", "kind", "layers", "3x3 mass (mean over layers)", "uniform 3x3 mass", "ratio"]
    columns += ["ratio per layer", "rows sum to one"]
    table = []
    for label, rows in per_model.items():
        if not rows:
            continue
        loc = sum(r["locality"] for r in rows) / len(rows)
        uni = sum(r["uniform"] for r in rows) / len(rows)
        ratio = loc / uni if uni else float("nan")
        per_layer = " / ".join(f"{r['locality'] / r['uniform']:.2f}" if r["uniform"] else "nan" for r in rows)
        kind = kinds[label]
        table.append([label, kind, len(rows), f"{loc:.4f}", f"{uni:.4f}", f"{ratio:.2f}", per_layer, _norm_note(kind)])
    return "\n".join(markdown_table(table, columns)) + "\n"


def masking_note(kinds: dict) -> str:
    """A line naming the models whose masked weights are zeroed, not renormalised, or ''."""
    plain = [f"{label} ({kind})" for label, kind in kinds.items() if _norm_note(kind) == "no"]
    if not plain:
        return ""
    return (
        f"\nMasked weights of {', '.join(plain)} are zeroed without renormalising: those kinds have no "
        "row normaliser (inline_attn.analysis.masking.NORMALISATION).\n"
    )


__all__ = [
    "FAMILIES",
    "WEIGHT_ANALYSES",
    "check_kinds",
    "confusion_table",
    "has_explicit_weights",
    "injectivity_by_kind",
    "injectivity_table",
    "kind_letter",
    "kind_models",
    "kind_pattern",
    "kind_weight_rows",
    "injectivity_of_models",
    "layer_weight_rows",
    "trained_kind_models",
    "locality_table",
    "masking_note",
    "model_kind",
    "plot_injectivity_by_kind",
    "split_by_weights",
]
