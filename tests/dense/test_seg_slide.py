"""Sliding-window inference refuses a stride larger than the crop (the gaps between windows would
get no prediction: NaN logits from 0 / 0)."""

from __future__ import annotations

import pytest
import torch

from inline_attn.dense import build_segmentor, slide_windows

from seg_helpers import TINY


@pytest.mark.parametrize("stride", [(40, 24), (24, 40), (40, 40)], ids=["rows", "cols", "both"])
def test_slide_windows_refuse_a_stride_larger_than_the_crop(stride):
    with pytest.raises(ValueError, match=r"stride \(\d+, \d+\) is larger than the crop \(32, 32\)"):
        slide_windows(100, 100, (32, 32), stride)


def test_slide_inference_with_a_stride_larger_than_the_crop_is_refused_not_nan():
    torch.manual_seed(0)
    name, kw = TINY["pvt"]
    m = build_segmentor("semantic_fpn", name, num_classes=3, channels=8, neck_channels=8, backbone_kwargs=kw).eval()
    x = torch.randn(1, 3, 64, 150)
    with pytest.raises(ValueError, match="larger than the crop"):
        m.predict(x, mode="slide", crop=(64, 64), stride=(64, 80))
    # a stride equal to the crop tiles the image: every pixel predicted, no NaN
    probs = m.predict(x, mode="slide", crop=(64, 64), stride=(64, 64))
    assert probs.shape == (1, 3, 64, 150) and torch.isfinite(probs).all()
    torch.testing.assert_close(probs.sum(1), torch.ones(1, 64, 150))
