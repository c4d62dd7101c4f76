"""Heads and the encoder-decoder: parameter counts against a hand count of mmseg's layouts (and
mmseg's own numbers), shapes at awkward sizes, sliding-window inference, the loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inline_attn.dense import FCNHead, FPN, FPNHead, UPerHead, build_segmentor, seg_cross_entropy, slide_windows
from inline_attn.models.profile import count_params

from seg_helpers import TINY


def conv(cin, cout, k, bias):
    return cin * cout * k * k + (cout if bias else 0)


def cbr(cin, cout, k):  # conv without bias + BatchNorm (weight, bias)
    return conv(cin, cout, k, False) + 2 * cout


def semantic_fpn_count(chs, k):
    neck = sum(conv(c, 256, 1, True) for c in chs) + 4 * conv(256, 256, 3, True)
    head = sum(cbr(256, 128, 3) + (n - 1) * cbr(128, 128, 3) for n in (1, 1, 2, 3)) + conv(128, k, 1, True)
    return neck + head


def upernet_count(chs, k, aux=True):
    c = 512
    head = (
        4 * cbr(chs[-1], c, 1)
        + cbr(chs[-1] + 4 * c, c, 3)
        + sum(cbr(x, c, 1) for x in chs[:-1])
        + 3 * cbr(c, c, 3)
        + cbr(4 * c, c, 3)
        + conv(c, k, 1, True)
    )
    return head + (cbr(chs[2], 256, 3) + conv(256, k, 1, True) if aux else 0)


PVT_T_BACKBONE = 12_032_232 - (512 * 1000 + 1000)  # reference count minus the classifier
SWIN_T_BACKBONE = 29_223_544 - (768 * 1000 + 1000) - 2 * 768 + 2 * (96 + 192 + 384 + 768)  # - head - norm + out norms

# Measured with mmsegmentation 1.2.2 (mmcv 2.1.0 built here) through the inline_attn.dense.mm
# plugin: configs/ade20k/mm/*.py built by mmseg's MODELS registry, 150 classes (docs/dense.md).
MMSEG_PARAMS = {
    ("semantic_fpn", "inline_pvt_tiny"): 15_785_878,
    ("upernet", "inline_pvt_tiny"): 42_007_084,
    ("upernet", "inline_swin_tiny"): 60_877_052,
}


@pytest.mark.parametrize("decode,backbone", sorted(MMSEG_PARAMS), ids=lambda v: str(v))
def test_param_counts_match_mmseg(decode, backbone):
    m = build_segmentor(decode, backbone, num_classes=150)
    chs = m.backbone.out_channels
    hand = semantic_fpn_count(chs, 150) if decode == "semantic_fpn" else upernet_count(chs, 150)
    bb = PVT_T_BACKBONE if backbone == "inline_pvt_tiny" else SWIN_T_BACKBONE
    n = count_params(m)
    print(f"{decode} on {backbone}: {n:,} (hand {bb + hand:,}, mmseg {MMSEG_PARAMS[(decode, backbone)]:,})")
    assert count_params(m.backbone) == bb
    assert n == bb + hand == MMSEG_PARAMS[(decode, backbone)]


def test_head_counts_on_awkward_channels():
    chs, k = [24, 40, 72, 136], 7
    fpn = FPN(chs, 256)
    head = FPNHead([256] * 4, [4, 8, 16, 32], 128, k)
    assert count_params(fpn) + count_params(head) == semantic_fpn_count(chs, k)
    uper = UPerHead(chs, 512, k)
    aux = FCNHead(chs[2], 256, k, in_index=2)
    assert count_params(uper) + count_params(aux) == upernet_count(chs, k)


@pytest.mark.parametrize("family", sorted(TINY))
@pytest.mark.parametrize("decode", ["semantic_fpn", "upernet"])
@pytest.mark.parametrize("size", [(64, 64), (70, 101)], ids=["64x64", "70x101"])
def test_segmentor_shapes_any_size(family, decode, size):
    name, kw = TINY[family]
    m = build_segmentor(decode, name, num_classes=5, channels=16, neck_channels=16, aux_channels=8, backbone_kwargs=kw)
    x = torch.randn(2, 3, *size)
    m.eval()
    logits = m(x)
    assert logits.shape == (2, 5, *size) and torch.isfinite(logits).all()
    m.train()
    y = torch.randint(0, 5, (2, *size))
    y[0, :3] = 255
    losses = m(x, y)
    assert set(losses) == ({"loss", "loss_decode", "loss_aux"} if decode == "upernet" else {"loss", "loss_decode"})
    losses["loss"].backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None]
    assert not missing, missing


def test_loss_combines_aux_with_its_weight():
    name, kw = TINY["pvt"]
    m = build_segmentor("upernet", name, num_classes=4, channels=8, aux_channels=8, dropout=0.0, backbone_kwargs=kw)
    m.eval()  # BatchNorm in eval: the same forward twice
    x, y = torch.randn(1, 3, 64, 64), torch.randint(0, 4, (1, 64, 64))
    out = m.loss(x, y)
    assert torch.allclose(out["loss"], out["loss_decode"] + 0.4 * out["loss_aux"])


def test_slide_windows_cover_the_image():
    for h, w, crop, stride in [
        (100, 130, (64, 64), (40, 40)),
        (50, 50, (64, 64), (32, 32)),
        (64, 64, (64, 64), (32, 32)),
    ]:
        wins = slide_windows(h, w, crop, stride)
        cover = torch.zeros(h, w)
        for y1, y2, x1, x2 in wins:
            assert 0 <= y1 < y2 <= h and 0 <= x1 < x2 <= w
            assert y2 - y1 == min(crop[0], h) and x2 - x1 == min(crop[1], w)
            cover[y1:y2, x1:x2] += 1
        assert (cover > 0).all()
    assert slide_windows(64, 64, (64, 64), (32, 32)) == [(0, 64, 0, 64)]
    # mmseg's grid: h_grids = max(h - crop + stride - 1, 0) // stride + 1
    assert len(slide_windows(512, 683, (512, 512), (341, 341))) == 1 * 2


def test_slide_inference_is_whole_inference_for_one_window():
    name, kw = TINY["pvt"]
    m = build_segmentor("semantic_fpn", name, num_classes=3, channels=8, neck_channels=8, backbone_kwargs=kw).eval()
    x = torch.randn(1, 3, 64, 64)
    whole = m.predict(x)
    slide = m.predict(x, mode="slide", crop=(64, 64), stride=(48, 48))
    torch.testing.assert_close(whole, slide)
    # overlapping windows: the average of each window's softmax-free logits, then softmax
    y = m.predict(torch.randn(1, 3, 64, 96), mode="slide", crop=(64, 64), stride=(32, 32), out_size=(32, 48))
    assert y.shape == (1, 3, 32, 48) and torch.allclose(y.sum(1), torch.ones(1, 32, 48))
    with pytest.raises(ValueError, match="crop and stride"):
        m.predict(x, mode="slide")
    with pytest.raises(ValueError, match="inference mode"):
        m.predict(x, mode="tile")


def test_slide_averages_overlaps_by_hand():
    name, kw = TINY["pvt"]
    m = build_segmentor("semantic_fpn", name, num_classes=3, channels=8, neck_channels=8, backbone_kwargs=kw).eval()
    x = torch.randn(1, 3, 64, 96)
    got = m.slide_inference(x, (64, 64), (32, 32))
    left, right = m.encode_decode(x[..., :64]), m.encode_decode(x[..., 32:])
    ref = torch.zeros_like(got)
    ref[..., :32] = left[..., :32]
    ref[..., 32:64] = (left[..., 32:] + right[..., :32]) / 2
    ref[..., 64:] = right[..., 32:]
    torch.testing.assert_close(got, ref)


def test_cross_entropy_ignore_and_averaging():
    logits = torch.randn(2, 4, 3, 5)
    y = torch.randint(0, 4, (2, 3, 5))
    y[0, 0] = 255
    keep = y != 255
    per_pixel = -F.log_softmax(logits, 1).gather(1, y.clamp(max=3).unsqueeze(1)).squeeze(1)
    by_hand_all = (per_pixel * keep).sum() / y.numel()
    by_hand_kept = (per_pixel * keep).sum() / keep.sum()
    torch.testing.assert_close(seg_cross_entropy(logits, y), by_hand_all)
    torch.testing.assert_close(seg_cross_entropy(logits, y, avg_non_ignore=True), by_hand_kept)
    bad = y.clone()
    bad[1, 1, 1] = 7
    with pytest.raises(ValueError, match=r"values \[7\] outside the 4 classes"):
        seg_cross_entropy(logits, bad)
    with pytest.raises(ValueError, match="same size"):
        seg_cross_entropy(logits, y[:, :2])
