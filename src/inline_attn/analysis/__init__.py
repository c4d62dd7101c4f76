"""The paper's analyses (Han et al., NeurIPS 2024): injectivity and semantic confusion (Fig. 1, 3),
attention maps (Fig. 4), locality (Fig. 5) and local masking (Table 2).

Every analysis reads attention weights only through the layers' record/hook API
(:func:`inline_attn.hook_attention`), reducing each layer's weights as they are produced, and
measures neighbourhoods in image coordinates (:mod:`.tokens`), so it works for global, windowed
and stripe attention alike. :mod:`.report` writes each analysis's files (``write_<analysis>``) and
:func:`.analyze.run_analysis` runs one analysis from names and paths, as ``inline-attn analyze`` does;
:mod:`.compare_kinds` runs them across every attention kind (``--kinds``) into one table each.
"""

from .analyze import ANALYSES, load_kind_models, load_models, run_analysis
from .attention_maps import QueryMapHook, attention_maps, parse_query, plot_attention_maps
from .common import ImageBatches, ImageSet, LoadedModel, load_images, load_model
from .confusion import (
    DEFAULT_RTOL,
    ConfusionCounter,
    confused_pairs,
    confusion_counts,
    distinct_rows,
    plot_confusion_histogram,
    row_tolerance,
)
from .injectivity import constructed_problem, injectivity, plot_injectivity, weight_rows
from .locality import LocalityMeter, local_mass, locality, plot_locality, record_locality, uniform_locality
from .masking import MaskingHook, masked_accuracy, plot_masking, random_like_window, renormalize_kept
from .report import (
    write_attention_maps,
    write_confusion,
    write_injectivity,
    write_injectivity_kinds,
    write_locality,
    write_masking,
)
from .tokens import TokenLayout, expand_groups, token_layout, window_mask

__all__ = [
    "ANALYSES",
    "DEFAULT_RTOL",
    "ImageBatches",
    "ConfusionCounter",
    "ImageSet",
    "LoadedModel",
    "LocalityMeter",
    "MaskingHook",
    "QueryMapHook",
    "TokenLayout",
    "attention_maps",
    "confused_pairs",
    "confusion_counts",
    "constructed_problem",
    "distinct_rows",
    "expand_groups",
    "injectivity",
    "load_images",
    "load_kind_models",
    "load_model",
    "load_models",
    "local_mass",
    "locality",
    "masked_accuracy",
    "parse_query",
    "plot_attention_maps",
    "plot_confusion_histogram",
    "plot_injectivity",
    "plot_locality",
    "plot_masking",
    "random_like_window",
    "record_locality",
    "renormalize_kept",
    "row_tolerance",
    "run_analysis",
    "token_layout",
    "uniform_locality",
    "weight_rows",
    "window_mask",
    "write_attention_maps",
    "write_confusion",
    "write_injectivity",
    "write_injectivity_kinds",
    "write_locality",
    "write_masking",
]
