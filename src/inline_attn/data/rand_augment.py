"""timm's RandAugment (``rand-m9-mstd0.5-inc1``), drawn per image, applied on the training device.

This is timm 0.4.12's ``rand_augment_transform`` (the version the authors trained with), written
here because timm cannot be imported beside a CPU build of torch. For every image and each of the
``n`` layers: an operation is drawn uniformly from the policy's 15 (with replacement; ``w0``:
timm's weights, without replacement), applied with probability 0.5, at a magnitude drawn from
``N(m, mstd)`` and clipped to [0, 10]; rotations, shears, translations and "increasing"
enhancements take a random sign. The magnitude maps to each operation's argument as in timm's
``LEVEL_TO_ARG`` (:data:`LEVEL_TO_ARG`; table in docs/training.md): at magnitude 9, rotations of
27 degrees, shears of 0.27, translations of 0.405 x the image side (timm's relative translate,
0.45 x the side at 10), enhancement factors 1 +- 0.81, posterize to 1 bit, solarize above 26,
solarize-add 99. Geometric operations fill with the normalisation mean (as timm's ``img_mean``)
and resample with the data's interpolation. The operations themselves follow Pillow's arithmetic
(:mod:`inline_attn.data.augment_ops`).

Images are float tensors holding 8-bit levels (0..255) ``[B, C, H, W]``; random draws use torch's
global generator on the CPU (saved in checkpoints: resumes are exact).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.nn as nn

from . import augment_ops as ops

MAX_LEVEL = 10.0  # timm's _MAX_LEVEL: magnitudes live on 0..10
OP_PROB = 0.5  # timm's rand_augment_ops(prob=0.5)
AFFINE_CHUNK = 16  # images per affine resampling call: ~80 MB of float64 temporaries per 224 x 224 image set

# timm 0.4.12 auto_augment.py _RAND_TRANSFORMS / _RAND_INCREASING_TRANSFORMS
RAND_OPS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "SolarizeAdd",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
RAND_INCREASING_OPS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "PosterizeIncreasing",
    "SolarizeIncreasing",
    "SolarizeAdd",
    "ColorIncreasing",
    "ContrastIncreasing",
    "BrightnessIncreasing",
    "SharpnessIncreasing",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
# timm's _RAND_CHOICE_WEIGHTS_0, by position in the op list (as timm indexes it for both lists)
CHOICE_WEIGHTS_0 = (0.025, 0.005, 0.0, 0.3, 0.0, 0.005, 0.005, 0.025, 0.005, 0.005, 0.025, 0.2, 0.2, 0.1, 0.1)


@dataclass(frozen=True)
class RandAugmentSpec:
    """A parsed policy string: ops per image, magnitude (0-10), its noise, the op list, weights."""

    num_ops: int = 2
    magnitude: float = MAX_LEVEL
    magnitude_std: float = 0.0
    increasing: bool = False
    weight_idx: Optional[int] = None

    @property
    def op_names(self) -> tuple[str, ...]:
        return RAND_INCREASING_OPS if self.increasing else RAND_OPS


def parse_rand_augment(spec: str) -> RandAugmentSpec:
    """``"rand-m9-mstd0.5-inc1"`` -> RandAugmentSpec(num_ops=2, magnitude=9, magnitude_std=0.5, increasing=True).

    Fields (timm's): ``m`` magnitude (default 10), ``n`` ops per image (default 2), ``mstd``
    magnitude noise (default 0), ``inc`` 1 for the "increasing" op variants, ``w0`` timm's op
    weights. (timm 0.4.12 reads ``inc0`` as on too, a slip of ``bool("0")``; here 0 is off.)
    """
    if not isinstance(spec, str) or spec.split("-")[0] != "rand":
        raise ValueError(
            f"auto_augment {spec!r}: only RandAugment policies 'rand-m<M>[-n<N>][-mstd<S>][-inc1]' are supported"
        )
    fields = {}
    for part in spec.split("-")[1:]:
        m = re.fullmatch(r"([a-z]+)(\d[\d.]*)", part)
        if m is None:
            raise ValueError(
                f"auto_augment {spec!r}: cannot parse field {part!r} (expected e.g. m9, n2, mstd0.5, inc1)"
            )
        key, val = m.groups()
        if key not in ("m", "n", "mstd", "inc", "w"):
            raise ValueError(f"auto_augment {spec!r}: unknown field {part!r} (known: m, n, mstd, inc, w)")
        try:
            fields[key] = float(val) if key in ("m", "mstd") else int(val)
        except ValueError:
            raise ValueError(f"auto_augment {spec!r}: field {part!r} needs a number") from None
    if fields.get("w", 0) != 0:
        raise ValueError(f"auto_augment {spec!r}: only weight set w0 exists")
    return RandAugmentSpec(
        num_ops=fields.get("n", 2),
        magnitude=fields.get("m", MAX_LEVEL),
        magnitude_std=fields.get("mstd", 0.0),
        increasing=bool(fields.get("inc", 0)),
        weight_idx=fields.get("w"),
    )


# ---- magnitude -> argument (timm 0.4.12 LEVEL_TO_ARG), float64 as Python computes it -------------


def _signed(v: torch.Tensor, negate: torch.Tensor) -> torch.Tensor:
    return torch.where(negate, -v, v)


def _enhance(m, neg):
    return (m / MAX_LEVEL) * 1.8 + 0.1


def _enhance_increasing(m, neg):
    return 1.0 + _signed((m / MAX_LEVEL) * 0.9, neg)


LEVEL_TO_ARG: dict[str, Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]] = {
    "AutoContrast": None,
    "Equalize": None,
    "Invert": None,
    "Rotate": lambda m, neg: _signed((m / MAX_LEVEL) * 30.0, neg),  # degrees
    "Posterize": lambda m, neg: torch.trunc((m / MAX_LEVEL) * 4),  # bits kept
    "PosterizeIncreasing": lambda m, neg: 4 - torch.trunc((m / MAX_LEVEL) * 4),
    "Solarize": lambda m, neg: torch.trunc((m / MAX_LEVEL) * 256),  # threshold
    "SolarizeIncreasing": lambda m, neg: 256 - torch.trunc((m / MAX_LEVEL) * 256),
    "SolarizeAdd": lambda m, neg: torch.trunc((m / MAX_LEVEL) * 110),  # added below 128
    "Color": _enhance,
    "Contrast": _enhance,
    "Brightness": _enhance,
    "Sharpness": _enhance,  # blend factor
    "ColorIncreasing": _enhance_increasing,
    "ContrastIncreasing": _enhance_increasing,
    "BrightnessIncreasing": _enhance_increasing,
    "SharpnessIncreasing": _enhance_increasing,
    "ShearX": lambda m, neg: _signed((m / MAX_LEVEL) * 0.3, neg),  # shear factor
    "ShearY": lambda m, neg: _signed((m / MAX_LEVEL) * 0.3, neg),
    "TranslateXRel": lambda m, neg: _signed((m / MAX_LEVEL) * 0.45, neg),  # fraction of the side
    "TranslateYRel": lambda m, neg: _signed((m / MAX_LEVEL) * 0.45, neg),
}


def op_argument(name: str, magnitude: torch.Tensor, negate: torch.Tensor) -> Optional[torch.Tensor]:
    """The argument operation ``name`` takes at ``magnitude`` [B] (0-10) with sign flips ``negate``
    [B] (bool); None for the operations that take none."""
    fn = LEVEL_TO_ARG[name]
    return None if fn is None else fn(magnitude.to(torch.float64).cpu(), negate.cpu())


GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")


def geometric_matrix(name: str, arg: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The affine matrices [B, 2, 3] of geometric operation ``name`` at arguments ``arg`` [B]."""
    if name == "Rotate":
        return ops.rotate_matrix(arg, height, width)
    if name.startswith("Shear"):
        return ops.shear_matrix(arg, name[-1].lower())
    # timm's translate_*_rel: pixels = fraction x the image's width (x) or height (y)
    axis = "x" if name == "TranslateXRel" else "y"
    return ops.translate_matrix(arg * (width if axis == "x" else height), axis)


def apply_op(
    name: str,
    x: torch.Tensor,
    magnitude: torch.Tensor,
    negate: torch.Tensor,
    *,
    fill: Sequence[float],
    interpolation: str = "bicubic",
) -> torch.Tensor:
    """Operation ``name`` on every image of ``x`` [B, C, H, W] (levels), each at its own
    ``magnitude`` [B] and sign ``negate`` [B]; returns levels."""
    arg = op_argument(name, magnitude, negate)
    if name in GEOMETRIC:
        return ops.affine(x, geometric_matrix(name, arg, *x.shape[-2:]), fill, interpolation)
    base = name.removesuffix("Increasing")
    simple = {"AutoContrast": ops.autocontrast, "Equalize": ops.equalize, "Invert": ops.invert}
    if base in simple:
        return simple[base](x)
    with_arg = {
        "Posterize": ops.posterize,
        "Solarize": ops.solarize,
        "SolarizeAdd": ops.solarize_add,
        "Color": ops.color,
        "Contrast": ops.contrast,
        "Brightness": ops.brightness,
        "Sharpness": ops.sharpness,
    }
    if base not in with_arg:
        raise ValueError(f"unknown RandAugment operation {name!r} (known: {', '.join(LEVEL_TO_ARG)})")
    return with_arg[base](x, arg.to(x.device))


def rand_augment_fill(mean: Sequence[float]) -> tuple[int, ...]:
    """timm's ``img_mean``: the normalisation mean (0-1 per channel) as 8-bit levels."""
    return tuple(min(255, round(255 * m)) for m in mean)


@dataclass
class Draws:
    """One batch's random choices, ``[B, n]`` each: operation index, applied or not, magnitude
    (after noise and clipping), sign flip."""

    op: torch.Tensor
    applied: torch.Tensor
    magnitude: torch.Tensor
    negate: torch.Tensor


class RandAugment(nn.Module):
    """timm's RandAugment for a batch, every image with its own operations (see the module doc).

    Args:
        spec: a policy string (``"rand-m9-mstd0.5-inc1"``) or a :class:`RandAugmentSpec`.
        mean: the normalisation mean (0-1 per channel); the fill of geometric operations is
            ``min(255, round(255 * mean))`` per channel, as timm's ``img_mean``.
        interpolation: "bicubic" or "bilinear" (the geometric operations' resampling).
    """

    def __init__(self, spec, mean: Sequence[float], interpolation: str = "bicubic"):
        super().__init__()
        self.spec = parse_rand_augment(spec) if isinstance(spec, str) else spec
        if interpolation not in ("bicubic", "bilinear"):
            raise ValueError(f"RandAugment interpolation {interpolation!r}: expected bicubic or bilinear")
        self.interpolation = interpolation
        self.fill = rand_augment_fill(mean)
        self.names = self.spec.op_names
        self.weights = torch.tensor(CHOICE_WEIGHTS_0, dtype=torch.float64) if self.spec.weight_idx is not None else None

    def sample(self, batch: int) -> Draws:
        """The random choices for ``batch`` images (torch's global CPU generator)."""
        n, k = self.spec.num_ops, len(self.names)
        if self.weights is None:  # np.random.choice(ops, n) in timm: with replacement
            op = torch.randint(0, k, (batch, n))
        else:  # weighted: without replacement
            op = torch.multinomial(self.weights.expand(batch, k), n, replacement=False)
        applied = torch.rand(batch, n) < OP_PROB
        mag = torch.full((batch, n), float(self.spec.magnitude), dtype=torch.float64)
        if self.spec.magnitude_std > 0:
            mag = mag + self.spec.magnitude_std * torch.randn(batch, n, dtype=torch.float64)
        mag = mag.clamp(0.0, MAX_LEVEL)
        negate = torch.rand(batch, n) > 0.5  # timm's _randomly_negate
        return Draws(op, applied, mag, negate)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, draws: Optional[Draws] = None) -> torch.Tensor:
        """x: [B, C, H, W] levels (0..255, float) -> the same, each image augmented."""
        draws = draws if draws is not None else self.sample(x.shape[0])
        x = x.clone()
        H, W = x.shape[-2:]
        for layer in range(self.spec.num_ops):
            op, applied = draws.op[:, layer], draws.applied[:, layer]
            mag, neg = draws.magnitude[:, layer], draws.negate[:, layer]
            # the geometric operations are one affine resampling: all their images in one call
            geo_rows, geo_mats = [], []
            for k in torch.unique(op[applied]).tolist():
                rows = torch.nonzero(applied & (op == k)).flatten()
                name = self.names[k]
                if name in GEOMETRIC:
                    geo_rows.append(rows)
                    geo_mats.append(geometric_matrix(name, op_argument(name, mag[rows], neg[rows]), H, W))
                    continue
                sel = rows.to(x.device)
                x[sel] = apply_op(name, x[sel], mag[rows], neg[rows], fill=self.fill, interpolation=self.interpolation)
            if geo_rows:
                rows, mats = torch.cat(geo_rows).to(x.device), torch.cat(geo_mats)
                for i in range(0, rows.numel(), AFFINE_CHUNK):  # bounds the float64 temporaries
                    sel = rows[i : i + AFFINE_CHUNK]
                    x[sel] = ops.affine(x[sel], mats[i : i + AFFINE_CHUNK], self.fill, self.interpolation)
        return x

    def extra_repr(self) -> str:
        s = self.spec
        return (
            f"n={s.num_ops}, m={s.magnitude:g}, mstd={s.magnitude_std:g}, increasing={s.increasing}, "
            f"fill={self.fill}, interpolation={self.interpolation}"
        )


__all__ = [
    "CHOICE_WEIGHTS_0",
    "Draws",
    "GEOMETRIC",
    "LEVEL_TO_ARG",
    "MAX_LEVEL",
    "OP_PROB",
    "RAND_INCREASING_OPS",
    "RAND_OPS",
    "RandAugment",
    "RandAugmentSpec",
    "apply_op",
    "geometric_matrix",
    "op_argument",
    "parse_rand_augment",
    "rand_augment_fill",
]
