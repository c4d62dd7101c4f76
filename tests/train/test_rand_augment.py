"""RandAugment as timm 0.4.12's: the magnitude -> argument mapping, every operation against Pillow
(the library timm's operations call), the per-image draws, and timm itself where it imports."""

import math
import random

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from inline_attn.data.rand_augment import (
    CHOICE_WEIGHTS_0,
    LEVEL_TO_ARG,
    RAND_INCREASING_OPS,
    RAND_OPS,
    Draws,
    RandAugment,
    apply_op,
    op_argument,
)

FILL = (124, 116, 104)  # timm's img_mean for the ImageNet mean
MAGNITUDES = (0, 5, 9, 10)

# timm 0.4.12 auto_augment.py, *_level_to_arg, worked out by hand at magnitudes 0, 5, 9, 10
# (before a random sign flip where the operation takes one)
DOCUMENTED = {
    "Rotate": (0.0, 15.0, 27.0, 30.0),  # degrees: m / 10 * 30
    "Posterize": (0, 2, 3, 4),  # bits kept: int(m / 10 * 4)
    "PosterizeIncreasing": (4, 2, 1, 0),  # 4 - int(m / 10 * 4)
    "Solarize": (0, 128, 230, 256),  # threshold: int(m / 10 * 256)
    "SolarizeIncreasing": (256, 128, 26, 0),  # 256 - int(m / 10 * 256)
    "SolarizeAdd": (0, 55, 99, 110),  # int(m / 10 * 110)
    "Color": (0.1, 1.0, 1.72, 1.9),  # m / 10 * 1.8 + 0.1
    "ColorIncreasing": (1.0, 1.45, 1.81, 1.9),  # 1 + m / 10 * 0.9
    "ShearX": (0.0, 0.15, 0.27, 0.3),  # m / 10 * 0.3
    "TranslateXRel": (0.0, 0.225, 0.405, 0.45),  # m / 10 * 0.45 of the side
}
for _base in ("Contrast", "Brightness", "Sharpness"):
    DOCUMENTED[_base] = DOCUMENTED["Color"]
    DOCUMENTED[_base + "Increasing"] = DOCUMENTED["ColorIncreasing"]
DOCUMENTED["ShearY"] = DOCUMENTED["ShearX"]
DOCUMENTED["TranslateYRel"] = DOCUMENTED["TranslateXRel"]
SIGNED = {
    "Rotate",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
    "ColorIncreasing",
    "ContrastIncreasing",
    "BrightnessIncreasing",
    "SharpnessIncreasing",
}
ALL_OPS = sorted(set(RAND_OPS) | set(RAND_INCREASING_OPS))


def fixed_image() -> np.ndarray:
    """37 x 45 RGB with gradients, rings, a flat patch and noise: awkward sizes, every level range."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:37, 0:45]
    img = np.stack([(xx * 5 + yy * 2) % 256, (yy * 7) % 256, ((xx - 22.5) ** 2 + (yy - 18.5) ** 2) % 256], -1)
    img = (0.7 * img + 0.3 * rng.integers(0, 256, img.shape)).astype(np.uint8)
    img[5:12, 8:20] = (250, 10, 30)
    return img


def as_levels(img: np.ndarray) -> torch.Tensor:
    """[H, W, 3] uint8 -> [1, 3, H, W] float levels."""
    return torch.from_numpy(np.array(img)).permute(2, 0, 1)[None].float()


def signed_arg(name: str, m_index: int, negate: bool) -> float:
    """The documented argument after timm's sign flip (enhancements flip around 1)."""
    v = DOCUMENTED[name][m_index]
    if not (negate and name in SIGNED):
        return v
    return 2.0 - v if name.endswith("Increasing") else -v


def pillow_op(name: str, img: Image.Image, arg) -> Image.Image:
    """What timm's operation does, written with Pillow directly (timm's auto_augment.py ops)."""
    base = name.removesuffix("Increasing")
    w, h = img.size
    geo = dict(resample=Image.BICUBIC, fillcolor=FILL)
    if base == "AutoContrast":
        return ImageOps.autocontrast(img)
    if base == "Equalize":
        return ImageOps.equalize(img)
    if base == "Invert":
        return ImageOps.invert(img)
    if base == "Rotate":
        return img.rotate(arg, **geo)
    if base == "Posterize":
        bits = int(arg)
        if bits >= 8:
            return img
        if bits == 0:  # Pillow >= 10 refuses 0 bits; older Pillow (the authors') masked every bit away
            return img.point([i & ~255 for i in range(256)] * 3)
        return ImageOps.posterize(img, bits)
    if base == "Solarize":
        return ImageOps.solarize(img, int(arg))
    if base == "SolarizeAdd":
        return img.point([min(255, i + int(arg)) if i < 128 else i for i in range(256)] * 3)
    if base in ("Color", "Contrast", "Brightness", "Sharpness"):
        return getattr(ImageEnhance, base)(img).enhance(arg)
    if base == "ShearX":
        return img.transform(img.size, Image.AFFINE, (1, arg, 0, 0, 1, 0), **geo)
    if base == "ShearY":
        return img.transform(img.size, Image.AFFINE, (1, 0, 0, arg, 1, 0), **geo)
    if base == "TranslateXRel":
        return img.transform(img.size, Image.AFFINE, (1, 0, arg * w, 0, 1, 0), **geo)
    if base == "TranslateYRel":
        return img.transform(img.size, Image.AFFINE, (1, 0, 0, 0, 1, arg * h), **geo)
    raise AssertionError(name)


def test_op_lists_and_weights_are_timms():
    assert len(RAND_OPS) == len(RAND_INCREASING_OPS) == len(CHOICE_WEIGHTS_0) == 15
    assert set(LEVEL_TO_ARG) == set(ALL_OPS)
    assert math.isclose(sum(CHOICE_WEIGHTS_0), 1.0)


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_magnitude_maps_to_the_documented_argument(name):
    m = torch.tensor(MAGNITUDES, dtype=torch.float64)
    for negate in (False, True):
        got = op_argument(name, m, torch.full((4,), negate))
        want = torch.tensor([signed_arg(name, i, negate) for i in range(4)], dtype=torch.float64)
        print(name, negate, got.tolist(), want.tolist())
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_operations_without_an_argument():
    m = torch.tensor(MAGNITUDES, dtype=torch.float64)
    for name in ("AutoContrast", "Equalize", "Invert"):
        assert op_argument(name, m, torch.zeros(4, dtype=torch.bool)) is None


@pytest.mark.parametrize("name", ALL_OPS)
def test_every_operation_equals_pillow_at_magnitudes_0_5_9_10(name):
    """Bit-exact: every level of every pixel equals Pillow's result for the documented argument."""
    img = fixed_image()
    pil, x = Image.fromarray(img), as_levels(img)
    signs = (False, True) if name in SIGNED else (False,)
    for i, m in enumerate(MAGNITUDES):
        for negate in signs:
            ours = apply_op(name, x, torch.tensor([float(m)], dtype=torch.float64), torch.tensor([negate]), fill=FILL)
            arg = signed_arg(name, i, negate) if name in DOCUMENTED else None
            ref = as_levels(np.asarray(pillow_op(name, pil, arg)))
            diff = (ours - ref).abs()
            print(
                f"{name} m={m} negate={negate}: max diff {diff.max().item():.0f}, {int((diff > 0).sum())} levels differ"
            )
            assert torch.equal(ours, ref)


def test_operations_take_one_argument_per_image():
    """A batch of the same image at four magnitudes equals the four single-image results."""
    x = as_levels(fixed_image()).expand(4, -1, -1, -1).contiguous()
    m = torch.tensor(MAGNITUDES, dtype=torch.float64)
    neg = torch.tensor([False, True, False, True])
    for name in ("Rotate", "SolarizeIncreasing", "ContrastIncreasing", "TranslateYRel", "Equalize"):
        batch = apply_op(name, x, m, neg, fill=FILL)
        for b in range(4):
            assert torch.equal(
                batch[b : b + 1], apply_op(name, x[b : b + 1], m[b : b + 1], neg[b : b + 1], fill=FILL)
            ), name


def test_draws_are_per_image_with_timms_probabilities_and_noise():
    ra = RandAugment("rand-m9-mstd0.5-inc1", (0.485, 0.456, 0.406))
    B = 20000
    d = ra.sample(B)
    assert d.op.shape == d.applied.shape == d.magnitude.shape == d.negate.shape == (B, 2)
    # ops uniform over 15 per image and per layer, with replacement (timm: np.random.choice(ops, 2))
    counts = torch.bincount(d.op.flatten(), minlength=15).double()
    expected = 2 * B / 15
    assert ((counts - expected).abs() < 5 * math.sqrt(expected)).all(), counts
    same = (d.op[:, 0] == d.op[:, 1]).double().mean().item()
    assert abs(same - 1 / 15) < 5 * math.sqrt(1 / 15 / B)
    # each op applied with probability 0.5; signs flipped with probability 0.5
    for frac in (d.applied.double().mean().item(), d.negate.double().mean().item()):
        assert abs(frac - 0.5) < 5 * math.sqrt(0.25 / (2 * B))
    # magnitude ~ N(9, 0.5) clipped to [0, 10]: P(clipped at 10) = P(z >= 2) = 0.02275
    mag = d.magnitude.flatten()
    assert mag.min() >= 0 and mag.max() == 10.0
    at_max = (mag == 10.0).double().mean().item()
    assert abs(at_max - 0.02275) < 5 * math.sqrt(0.02275 / (2 * B))
    # below the clip: N(9, 0.5) truncated at 10 (z = 2): mean 9 - 0.5 r, std 0.5 sqrt(1 - 2 r - r^2),
    # r = pdf(2) / cdf(2)
    r = math.exp(-2) / math.sqrt(2 * math.pi) / (0.5 * (1 + math.erf(2 / math.sqrt(2))))
    inner = mag[mag < 10.0]
    se = 0.5 / math.sqrt(inner.numel())
    assert abs(inner.mean().item() - (9 - 0.5 * r)) < 5 * se
    assert abs(inner.std().item() - 0.5 * math.sqrt(1 - 2 * r - r * r)) < 5 * se
    # without noise the magnitude is the policy's
    assert (RandAugment("rand-m7", (0.5,)).sample(100).magnitude == 7.0).all()
    # weighted choice (w0): without replacement, never the zero-weight ops
    dw = RandAugment("rand-m9-w0", (0.5,)).sample(2000)
    assert (dw.op[:, 0] != dw.op[:, 1]).all() and not torch.isin(dw.op, torch.tensor([2, 4])).any()


def test_forward_applies_each_images_own_draws_in_order():
    ra = RandAugment("rand-m9-mstd0.5-inc1", (0.485, 0.456, 0.406))
    x = as_levels(fixed_image()).expand(3, -1, -1, -1).contiguous()
    idx = {n: i for i, n in enumerate(ra.names)}
    draws = Draws(
        op=torch.tensor(
            [
                [idx["Rotate"], idx["SolarizeIncreasing"]],
                [idx["Invert"], idx["Equalize"]],
                [idx["ShearX"], idx["ShearX"]],
            ]
        ),
        applied=torch.tensor([[True, True], [False, False], [True, False]]),
        magnitude=torch.tensor([[9.3, 8.1], [9.0, 9.0], [10.0, 2.0]], dtype=torch.float64),
        negate=torch.tensor([[True, False], [False, False], [False, True]]),
    )
    out = ra(x, draws)

    def one(name, img, m, neg):
        return apply_op(name, img, torch.tensor([m], dtype=torch.float64), torch.tensor([neg]), fill=ra.fill)

    assert torch.equal(out[0:1], one("SolarizeIncreasing", one("Rotate", x[0:1], 9.3, True), 8.1, False))
    assert torch.equal(out[1:2], x[1:2])  # neither op applied
    assert torch.equal(out[2:3], one("ShearX", x[2:3], 10.0, False))


def _import_timm():
    try:
        import timm.data.auto_augment as aa
    except Exception as e:  # not installed, or (beside a CPU torch) its torchvision fails to load
        pytest.skip(
            f"timm does not import here ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            "this comparison runs where it does (e.g. the GPU machine's python)"
        )
    return aa


def test_against_timm_itself(monkeypatch):
    """Where timm imports: every operation's level function and Pillow call, as its AugmentOp
    calls them (fill = img_mean, bicubic), at magnitudes 0, 5, 9, 10 and both signs."""
    aa = _import_timm()
    img = fixed_image()
    pil, x = Image.fromarray(img), as_levels(img)
    hparams = dict(translate_const=int(224 * 0.45), img_mean=FILL, interpolation=Image.BICUBIC)
    assert tuple(aa._RAND_INCREASING_TRANSFORMS) == RAND_INCREASING_OPS and tuple(aa._RAND_TRANSFORMS) == RAND_OPS
    for name in ALL_OPS:
        for m in MAGNITUDES:
            for negate in (False, True):
                # timm's _randomly_negate flips when random.random() > 0.5
                monkeypatch.setattr(random, "random", lambda: 0.9 if negate else 0.1)
                fn = aa.LEVEL_TO_ARG[name]
                args = fn(float(m), hparams) if fn is not None else ()
                mag, neg = torch.tensor([float(m)], dtype=torch.float64), torch.tensor([negate])
                if args:
                    assert op_argument(name, mag, neg).item() == pytest.approx(args[0], abs=1e-12), (name, m, negate)
                if name.startswith("Posterize") and args and args[0] == 0:
                    continue  # current Pillow refuses 0 bits (test_every_operation_equals_pillow_... covers it)
                ref = aa.NAME_TO_OP[name](pil, *args, fillcolor=FILL, resample=Image.BICUBIC)
                ours = apply_op(name, x, mag, neg, fill=FILL)
                assert torch.equal(ours, as_levels(np.asarray(ref))), (name, m, negate)
