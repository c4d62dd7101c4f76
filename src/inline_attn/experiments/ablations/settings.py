"""The ablations' grid: the parts, their settings (one model and recipe each), the presets' budgets,
and the plan of (setting, seed) runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from ...layers import uses_local_residual
from ...models import PATTERN_KINDS
from ...train.config import FMNIST_VARIANTS

ABLATION_CONFIG = "ablations/_base.yaml"
FEATURE_MAPS_A = ("identity", "relu", "leakyrelu", "exp", "affine_relu")
FEATURE_MAPS_C = ("identity", "relu", "leakyrelu", "exp")
WINDOWS = (7, 14, 28)
COMPARED = (
    "inline",
    "softmax",
    "linear",
    "hydra",
    "efficient",
    "angular",
    "relu_msa",
    "focused",
    "agent",
    "polarity",
    "mlla",
)  # InLine trains first
MASKED = ("softmax", "linear", "inline")
PARTS = "abcdefg"
PLAN_ORDER = "deabcgf"  # training order: the comparison (and the masked models) first
LETTER = {kind: letter for letter, kind in PATTERN_KINDS.items()}  # attention kind -> pattern letter
NAMES = {
    "inline": "InLine",
    "linear": "linear",
    "softmax": "softmax (Swin windows of 7)",
    "hydra": "Hydra",
    "efficient": "Efficient attention",
    "angular": "linear-angular (Castling-ViT)",
    "relu_msa": "ReLU multi-scale (EfficientViT)",
    "focused": "focused (FLatten)",
    "agent": "Agent attention",
    "polarity": "polarity-aware (PolaFormer)",
    "mlla": "MLLA's linear attention",
}


@dataclass(frozen=True)
class Budget:
    """What one run of a preset costs: training images per epoch, epochs, evaluation images."""

    subset: int  # training images per epoch of the locality task (0: all 60,000)
    val_subset: int  # test images scored (0: all 10,000)
    epochs: int
    fmnist_epochs: int  # part g (0: the configs' own)
    fmnist_subset: int  # part g training images (0: all)
    mask_images: int  # part e test images
    bench_batch: int  # inference img/s: batch and timed iterations
    bench_iters: int
    overrides: tuple = ()  # further config overrides of every run: (key, value) pairs

    def describe(self) -> str:
        """The budget in words, for the report and its verdicts."""
        extra = "".join(f", {k}={v}" for k, v in self.overrides)
        return f"{self.epochs} epoch(s) of {self.subset or 60000} training images per run{extra}"


# The GPU preset: every run 2 epochs of all 60,000 training images (10x the full preset's 12,000
# images), batch 256 (the recipe scales the learning rate with the batch: base_lr x 256 / 512) on
# CUDA. Sized from a measured CPU step (docs/reproduction.md, "The GPU preset"): parts a, b and d
# with 3 seeds are 72 runs of 469 steps, an estimated ~20 min on one H100, not a measurement.
# Fashion-MNIST stays uint8 in host memory; each batch (256 x 784 bytes) is copied pinned and
# non-blocking, and the resize, flip and normalisation run on the device.
GPU_OVERRIDES = (("data.batch_size", 256), ("train.device", "cuda"), ("data.on_device", True))
PRESETS = {
    "full": Budget(12000, 0, 1, 0, 0, 1000, 128, 10),
    "quick": Budget(1024, 500, 1, 1, 2048, 100, 32, 3),
    "gpu": Budget(0, 0, 2, 0, 0, 1000, 128, 10, overrides=GPU_OVERRIDES),
}


@dataclass(frozen=True)
class Setting:
    """One model and recipe, trained once per seed."""

    key: str
    label: str
    kind: str
    config: str
    overrides: tuple = field(default_factory=tuple)


def swin_setting(
    kind: str, feature_map: Optional[str] = None, window: int = 28, residual: Optional[bool] = None
) -> Setting:
    """A setting of the locality task; equal settings of different parts share one key (and runs).
    Its overrides are ``model.kwargs.{pattern, feature_map, window_size, local_residual}``."""
    if kind == "inline":
        feature_map = feature_map or "identity"
    elif kind == "linear":
        feature_map = feature_map or "relu"
    res = uses_local_residual(kind, residual)
    key = f"{kind}{'-' + feature_map if feature_map else ''}-w{window}{'-res' if res else ''}"
    label = NAMES[kind] + (f", {feature_map}" if feature_map else "")
    label += f", window {window}" if kind != "softmax" else ""
    label += ", residual" if res and kind != "inline" else (", no residual" if kind == "inline" and not res else "")
    ov = (
        ("model.kwargs.pattern", LETTER[kind] * 3),
        ("model.kwargs.feature_map", feature_map),
        ("model.kwargs.window_size", window),
        ("model.kwargs.local_residual", res),
    )
    return Setting(key, label, kind, ABLATION_CONFIG, ov)


def part_settings(part: str) -> list[Setting]:
    """The settings part ``part`` (a letter of :data:`PARTS`) trains or reads."""
    if part == "a":
        return [swin_setting(k, kern, residual=False) for kern in FEATURE_MAPS_A for k in ("linear", "inline")]
    if part == "b":
        return [swin_setting("inline", window=w, residual=r) for w in WINDOWS for r in (False, True)]
    if part == "c":
        return [swin_setting("inline", kern) for kern in FEATURE_MAPS_C]
    if part in "def":
        kinds = MASKED if part == "e" else COMPARED
        if part == "f":
            return unique(s for p in "abcd" for s in part_settings(p))
        return [swin_setting(k) for k in kinds]
    if part == "g":
        fm = "fmnist/{}.yaml"
        return [Setting(f"fmnist-{v}", f"fmnist {v}", v, fm.format(v)) for v in FMNIST_VARIANTS]
    raise ValueError(f"unknown part {part!r}: expected letters of {PARTS!r}")


def unique(settings) -> list[Setting]:
    seen, out = set(), []
    for s in settings:
        if s.key not in seen:
            seen.add(s.key)
            out.append(s)
    return out


def check_parts(parts: str) -> str:
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise ValueError(f"parts {parts!r}: expected letters of {PARTS!r}")
    return parts


def plan(parts: str, seeds: Sequence[int]) -> list[tuple[Setting, int]]:
    """Every (setting, seed) the parts need, settings shared between parts trained once. Part by
    part in the order of :data:`PLAN_ORDER` (the comparison first), every seed of a setting before
    the next setting, so a partial run has whole parts with all their seeds."""
    check_parts(parts)
    ordered = [p for p in PLAN_ORDER if p in parts]
    settings = unique(s for p in ordered for s in part_settings(p))
    return [(s, seed) for s in settings for seed in seeds]
