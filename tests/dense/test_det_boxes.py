"""Box coding, IoU and NMS against brute-force references written from their definitions."""

from __future__ import annotations

import pytest
import torch

from inline_attn.dense.data.transforms import flip_boxes
from inline_attn.dense.models.boxes import (
    batched_nms,
    box_iou,
    clean_targets,
    decode_ltrb,
    encode_ltrb,
    nms,
    select_detections,
)


def _random_boxes(n, seed, size=50.0, integer=False):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * size
    wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * size / 2
    b = torch.cat([xy, xy + wh], 1)
    return b.round() if integer else b


def _iou_ref(a, b) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _nms_ref(boxes, scores, thr) -> list[int]:
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    keep = []
    for i in order:
        if all(_iou_ref(boxes[i], boxes[j]) <= thr for j in keep):
            keep.append(i)
    return keep


def test_iou_matches_definition():
    a, b = _random_boxes(13, 0), _random_boxes(7, 1)
    ref = torch.tensor([[_iou_ref(x, y) for y in b.tolist()] for x in a.tolist()], dtype=torch.float64)
    torch.testing.assert_close(box_iou(a, b), ref, rtol=1e-12, atol=1e-12)
    # empty boxes: IoU 0, not NaN
    e = torch.tensor([[3.0, 3.0, 3.0, 9.0]])
    assert box_iou(e, e).item() == 0.0


@pytest.mark.parametrize("thr", [0.0, 0.3, 0.5, 0.7])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nms_matches_brute_force(thr, seed):
    boxes = _random_boxes(97, seed, integer=True).float()  # integer corners: exact IoU ties happen
    g = torch.Generator().manual_seed(seed + 10)
    scores = (torch.rand(97, generator=g) * 10).round() / 10  # repeated scores: the stable order matters
    keep = nms(boxes, scores, thr)
    assert keep.tolist() == _nms_ref(boxes.tolist(), scores.tolist(), thr)


def test_batched_nms_is_per_class():
    boxes = _random_boxes(80, 5).float()
    g = torch.Generator().manual_seed(3)
    scores, classes = torch.rand(80, generator=g), torch.randint(0, 4, (80,), generator=g)
    ref = []
    for c in range(4):
        idx = torch.nonzero(classes == c).squeeze(1).tolist()
        ref += [idx[k] for k in _nms_ref(boxes[idx].tolist(), scores[idx].tolist(), 0.5)]
    ref = sorted(ref, key=lambda i: -scores[i].item())
    assert batched_nms(boxes, scores, classes, 0.5).tolist() == ref
    # the same box in two classes survives twice
    same = torch.tensor([[0.0, 0.0, 10.0, 10.0]] * 2)
    assert sorted(batched_nms(same, torch.tensor([0.9, 0.8]), torch.tensor([0, 1]), 0.5).tolist()) == [0, 1]
    assert nms(same, torch.tensor([0.9, 0.8]), 0.5).tolist() == [0]


def test_nms_empty_and_bad_input():
    assert nms(torch.zeros(0, 4), torch.zeros(0), 0.5).numel() == 0
    with pytest.raises(ValueError, match="x2 < x1"):
        nms(torch.tensor([[5.0, 0.0, 1.0, 4.0]]), torch.ones(1), 0.5)
    with pytest.raises(ValueError, match="scores of shape"):
        nms(torch.zeros(3, 4), torch.ones(2), 0.5)


def test_ltrb_round_trip():
    boxes = _random_boxes(31, 4)
    g = torch.Generator().manual_seed(0)
    pts = torch.rand(31, 2, generator=g, dtype=torch.float64) * 60
    for stride in (1.0, 4.0, 32.0):
        d = encode_ltrb(pts, boxes, stride)
        torch.testing.assert_close(decode_ltrb(pts, d, stride), boxes, rtol=0, atol=1e-12)
    # a point inside its box has four positive distances
    d = encode_ltrb(torch.tensor([[5.0, 6.0]]), torch.tensor([[2.0, 3.0, 10.0, 8.0]]), 1.0)
    assert d.tolist() == [[3.0, 3.0, 5.0, 2.0]]
    # flipping twice is the identity
    torch.testing.assert_close(flip_boxes(flip_boxes(boxes, 64), 64), boxes)


def test_clean_targets_clips_drops_and_refuses():
    boxes = torch.tensor(
        [[-5.0, 2.0, 10.0, 12.0], [70.0, 0.0, 80.0, 9.0], [3.0, 3.0, 3.0, 9.0], [60.0, 60.0, 70.0, 70.0]]
    )
    labels = torch.tensor([0, 1, 2, 3])
    b, lab = clean_targets(boxes, labels, (64, 64), 4)
    assert b.tolist() == [[0.0, 2.0, 10.0, 12.0], [60.0, 60.0, 64.0, 64.0]]  # outside and zero-width dropped
    assert lab.tolist() == [0, 3]
    with pytest.raises(ValueError, match="x2 < x1"):
        clean_targets(torch.tensor([[5.0, 0.0, 1.0, 4.0]]), torch.tensor([0]), (64, 64), 4)
    with pytest.raises(ValueError, match="not finite"):
        clean_targets(torch.tensor([[0.0, 0.0, float("nan"), 4.0]]), torch.tensor([0]), (64, 64), 4)
    with pytest.raises(ValueError, match=r"labels \[7\] outside 0..3"):
        clean_targets(torch.tensor([[0.0, 0.0, 4.0, 4.0]]), torch.tensor([7]), (64, 64), 4)
    with pytest.raises(ValueError, match=r"expected \[N, 4\]"):
        clean_targets(torch.zeros(2, 5), torch.tensor([0, 1]), (64, 64), 4)


def test_select_detections_clips_and_caps():
    boxes = torch.tensor(
        [[-3.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0], [70.0, 70.0, 80.0, 80.0]]
    )
    out = select_detections(
        boxes,
        torch.tensor([0.9, 0.8, 0.7, 0.6]),
        torch.tensor([1, 1, 2, 0]),
        iou_threshold=0.5,
        max_per_image=5,
        image_size=(64, 64),
    )
    assert out["boxes"].tolist() == [[0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0]]
    assert out["labels"].tolist() == [1, 2]
    out = select_detections(
        boxes, torch.tensor([0.9, 0.8, 0.7, 0.6]), torch.tensor([0, 1, 2, 3]), iou_threshold=0.5, max_per_image=1
    )
    assert out["scores"].tolist() == [pytest.approx(0.9)]
