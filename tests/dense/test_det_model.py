"""The FCOS detector: shapes at odd input sizes, target assignment by hand, empty images and bad
targets, gradients reaching every parameter."""

from __future__ import annotations

import pytest
import torch

from inline_attn.dense.models.detector import build_detector, level_points

from seg_helpers import TINY


def _tiny(family="pvt", **kw):
    name, mkw = TINY[family]
    torch.manual_seed(0)
    return build_detector(name, 3, backbone_kwargs=dict(mkw), neck_channels=16, num_convs=1, **kw)


def _targets():
    return [
        {"boxes": torch.tensor([[3.0, 4.0, 30.0, 33.0], [40.0, 10.0, 70.0, 50.0]]), "labels": torch.tensor([0, 2])},
        {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long)},  # an image without objects
    ]


@pytest.mark.parametrize("family", ["pvt", "swin"])
@pytest.mark.parametrize("size", [(61, 77), (32, 32), (45, 100)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_shapes_any_size(family, size):
    model = _tiny(family)
    x = torch.randn(2, 3, *size)
    losses = model(x, _targets())
    assert set(losses) == {"loss", "loss_cls", "loss_box", "loss_ctr"}
    assert all(torch.isfinite(v) for v in losses.values())
    losses["loss"].backward()
    assert [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None] == []
    model.eval()
    out = model(x)
    assert len(out) == 2
    for r in out:
        d = r["boxes"].shape[0]
        assert r["boxes"].shape == (d, 4) and r["scores"].shape == (d,) and r["labels"].shape == (d,)
        assert d <= model.max_per_image
        assert (r["boxes"][:, 0] >= 0).all() and (r["boxes"][:, 2] <= size[1]).all()
        assert (r["boxes"][:, 3] <= size[0]).all() and (r["labels"] < 3).all()


def test_points_are_cell_centres():
    (p,) = level_points([(2, 3)], [8])
    assert p.tolist() == [[4.0, 4.0], [12.0, 4.0], [20.0, 4.0], [4.0, 12.0], [12.0, 12.0], [20.0, 12.0]]


def test_assignment_by_hand():
    """Strides 4, 8, 16, 32, range_scale 8 (level 0 takes largest distances in [0, 32)), centre
    radius 1.5 strides. Box A [10, 30]^2: centre region (14, 26)^2 holds the stride-4 centres
    {18, 22}^2. Box B [4, 44]^2: region (18, 30)^2 holds {22, 26}^2 at stride 4 (largest
    distance <= 22: level 0) and {20, 28}^2 at stride 8, whose largest distance 24 < 32 does not
    fit level 1. Where both claim a point, (22, 22), the smaller A wins."""
    model = _tiny()
    pts = level_points([(16, 16), (8, 8), (4, 4), (2, 2)], model.strides)
    boxes = torch.tensor([[10.0, 10.0, 30.0, 30.0], [4.0, 4.0, 44.0, 44.0]])
    lab, gt = model.assign(pts, boxes, torch.tensor([1, 2]))
    k, allp = model.num_classes, torch.cat(pts)

    def where(label):
        return sorted(tuple(allp[i].tolist()) for i in torch.nonzero(lab == label).squeeze(1))

    assert where(1) == [(18.0, 18.0), (18.0, 22.0), (22.0, 18.0), (22.0, 22.0)]
    assert where(2) == [(22.0, 26.0), (26.0, 22.0), (26.0, 26.0)]
    assert int((lab == k).sum()) == len(allp) - 7
    assert (gt[lab == 1] == boxes[0]).all() and (gt[lab == 2] == boxes[1]).all()
    # no boxes: every point is background
    lab, _ = model.assign(pts, torch.zeros(0, 4), torch.zeros(0, dtype=torch.long))
    assert (lab == k).all()


def test_all_empty_batch_trains():
    model = _tiny()
    x = torch.randn(2, 3, 32, 32)
    empty = {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long)}
    losses = model(x, [empty, empty])
    assert losses["loss_box"].item() == 0.0 and losses["loss_ctr"].item() == 0.0 and losses["loss_cls"] > 0
    losses["loss"].backward()


def test_boxes_outside_the_image_are_dropped_not_fatal():
    model = _tiny()
    x = torch.randn(1, 3, 32, 32)
    t = [{"boxes": torch.tensor([[40.0, 40.0, 60.0, 60.0], [-10.0, 5.0, 12.0, 20.0]]), "labels": torch.tensor([0, 1])}]
    assert torch.isfinite(model(x, t)["loss"])


@pytest.mark.parametrize(
    "target,match",
    [
        ({"boxes": torch.tensor([[10.0, 0.0, 2.0, 5.0]]), "labels": torch.tensor([0])}, "x2 < x1"),
        ({"boxes": torch.tensor([[0.0, 0.0, 2.0, 5.0]]), "labels": torch.tensor([3])}, r"labels \[3\] outside 0..2"),
        ({"boxes": torch.tensor([[0.0, 0.0, 2.0]]), "labels": torch.tensor([0])}, r"\[N, 4\]"),
        ({"boxes": torch.tensor([[0.0, 0.0, 2.0, 5.0]])}, "'labels'"),
    ],
    ids=["inverted", "label", "shape", "no-labels"],
)
def test_bad_targets_raise(target, match):
    model = _tiny()
    with pytest.raises(ValueError, match=match):
        model(torch.randn(1, 3, 32, 32), [target])


def test_mismatched_batch_and_bad_images():
    model = _tiny()
    with pytest.raises(ValueError, match="2 images but 1 targets"):
        model(torch.randn(2, 3, 32, 32), _targets()[:1])
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        model(torch.randn(3, 32, 32))
    with pytest.raises(ValueError, match="at least one class"):
        build_detector("inline_pvt_tiny", 0, backbone_kwargs=dict(TINY["pvt"][1]))
