"""create_model's common arguments give clear errors; images smaller than the stem are padded
with a one-time warning."""

import warnings

import pytest
import torch

from inline_attn import create_model
from inline_attn.layers import patch_embed


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_classes": -1}, r"num_classes=-1\): expected an integer >= 0"),
        ({"num_classes": 2.5}, r"num_classes=2.5\): expected an integer >= 0"),
        ({"depth": "4"}, r"depth='4'\): expected an integer >= 1"),
        ({"in_chans": 0}, r"in_chans=0\): expected an integer >= 1"),
        ({"img_size": (32, "32")}, r"img_size=\(32, '32'\)\): expected a positive integer or a \(height, width\)"),
        ({"drop_path_rate": 1.5}, r"drop_path_rate=1.5\): expected a number in \[0, 1\)"),
        ({"depths": (1, 0)}, r"depths=\(1, 0\)\): expected an integer >= 1, or a sequence of them"),
        ({"windw_size": 7}, r"model 'inline_deit_tiny' takes no argument 'windw_size'"),
    ],
)
def test_bad_common_arguments_are_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        create_model("inline_deit_tiny", **kwargs)


def test_zero_classes_is_a_headless_model():
    m = create_model("inline_deit_tiny", num_classes=0, depth=1, embed_dim=24, num_heads=2, img_size=32)
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 24)


@pytest.mark.parametrize(
    "name, kwargs, size",
    [
        ("inline_deit_tiny", dict(depth=1, embed_dim=24, num_heads=2, img_size=32), (8, 9)),
        ("inline_cswin_tiny", dict(depths=(1, 1, 1, 1), embed_dim=16, num_heads=(1, 1, 2, 2), img_size=32), (2, 2)),
    ],
)
def test_image_smaller_than_the_stem_is_padded_with_one_warning(name, kwargs, size, monkeypatch):
    monkeypatch.setattr(patch_embed, "_WARNED_SMALL", set())
    m = create_model(name, num_classes=3, **kwargs).eval()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        y1 = m(torch.randn(1, 3, *size))
        y2 = m(torch.randn(2, 3, *size))
        m(torch.randn(1, 3, 32, 32))
    msgs = [str(w.message) for w in caught if "smaller than the stem" in str(w.message)]
    assert len(msgs) == 1 and str(tuple(size)) in msgs[0], msgs
    assert y1.shape == (1, 3) and y2.shape == (2, 3) and torch.isfinite(y1).all()
