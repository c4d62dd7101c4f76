"""A model's input is checked at the stem: images [B, C, H, W], floating point, of the weights'
dtype (any under autocast), at least one pixel a side; an empty batch gives an empty result."""

from __future__ import annotations

import pytest
import torch

from inline_attn import create_model

SMALL = {
    "inline_deit_tiny": dict(depth=1, embed_dim=16, num_heads=2, img_size=32, patch_size=4),
    "inline_pvt_tiny": dict(img_size=32, embed_dims=(8, 8, 8, 8), num_heads=(1, 1, 1, 1), depths=(1, 1, 1, 1)),
    "inline_swin_tiny": dict(img_size=32, embed_dim=8, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4), window_size=4),
    "inline_cswin_tiny": dict(img_size=32, embed_dim=8, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2)),
}
_MODELS: dict = {}


def model(name: str) -> torch.nn.Module:
    if name not in _MODELS:
        _MODELS[name] = create_model(name, num_classes=3, **SMALL[name]).eval()
    return _MODELS[name]


BAD = [
    ("uint8", torch.zeros(1, 3, 32, 32, dtype=torch.uint8), r"images of dtype torch.uint8: convert them to floating"),
    ("int64", torch.zeros(1, 3, 32, 32, dtype=torch.int64), r"images of dtype torch.int64: convert them to floating"),
    ("bool", torch.zeros(1, 3, 32, 32, dtype=torch.bool), r"images of dtype torch.bool: convert them to floating"),
    (
        "float64",
        torch.zeros(1, 3, 32, 32, dtype=torch.float64),
        r"images of dtype torch.float64 but the model",
    ),
    (
        "float16",
        torch.zeros(1, 3, 32, 32, dtype=torch.float16),
        r"images of dtype torch.float16 but the model",
    ),
    ("0x0", torch.zeros(1, 3, 0, 0), r"images of size 0x0: expected at least one pixel"),
    ("0 high", torch.zeros(2, 3, 0, 32), r"images of size 0x32: expected at least one pixel"),
    ("0 wide", torch.zeros(2, 3, 32, 0), r"images of size 32x0: expected at least one pixel"),
    ("rank 3", torch.zeros(3, 32, 32), r"expected images \[B, 3, H, W\], got shape \(3, 32, 32\)"),
    ("1 channel", torch.zeros(1, 1, 32, 32), r"expected images \[B, 3, H, W\], got shape \(1, 1, 32, 32\)"),
    ("array", [[0.0]], r"expected images as a torch.Tensor"),
]


@pytest.mark.parametrize("case, x, message", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("name", sorted(SMALL))
def test_bad_images_are_refused_saying_what_to_do(name, case, x, message):
    with pytest.raises(ValueError, match=message), torch.no_grad():
        model(name)(x)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_neighbours_of_the_refused_images_run(name):
    m = model(name)
    with torch.no_grad():
        assert m(torch.zeros(0, 3, 32, 32)).shape == (0, 3)  # an empty batch: an empty result
        assert m(torch.rand(1, 3, 1, 1)).shape == (1, 3)  # one pixel: padded to the stem, with a warning
        with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts float32 images itself
            assert m(torch.rand(1, 3, 32, 32)).shape == (1, 3)
        double = create_model(name, num_classes=3, **SMALL[name]).double().eval()
        assert double(torch.rand(1, 3, 32, 32, dtype=torch.float64)).dtype == torch.float64
