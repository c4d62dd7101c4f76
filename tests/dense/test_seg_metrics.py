"""mIoU / mAcc / aAcc against a hand computation (mmseg's definitions), and their reduction
across processes."""

from __future__ import annotations

import math
import socket

import pytest
import torch
import torch.multiprocessing as mp

from inline_attn.dense import SegMetric, confusion_matrix, metrics_from_confusion


def _hand_case():
    # 3 classes + ignore; one image 2 x 6
    target = torch.tensor([[0, 0, 0, 1, 1, 255], [0, 2, 2, 1, 255, 255]])
    pred = torch.tensor([[0, 0, 1, 1, 1, 2], [2, 2, 0, 1, 0, 0]])
    return pred, target


def test_confusion_by_hand():
    pred, target = _hand_case()
    conf = confusion_matrix(pred, target, 3)
    # kept pixels (gt, pred): (0,0) (0,0) (0,1) (1,1) (1,1) | (0,2) (2,2) (2,0) (1,1)
    assert conf.tolist() == [[2, 1, 1], [0, 3, 0], [1, 0, 1]]


def test_metrics_by_hand():
    pred, target = _hand_case()
    m = SegMetric(3)
    m.update(pred, target)
    res = m.compute()
    # intersect = (2, 3, 1); label = (4, 3, 2); pred = (3, 4, 2); union = (5, 4, 3)
    iou = [2 / 5, 3 / 4, 1 / 3]
    acc = [2 / 4, 3 / 3, 1 / 2]
    assert res["IoU"] == pytest.approx([100 * v for v in iou])
    assert res["Acc"] == pytest.approx([100 * v for v in acc])
    assert res["mIoU"] == pytest.approx(100 * sum(iou) / 3)
    assert res["mAcc"] == pytest.approx(100 * sum(acc) / 3)
    assert res["aAcc"] == pytest.approx(100 * 6 / 9)
    assert res["pixels"] == 9


def test_absent_classes_follow_mmseg():
    # class 2 never in the ground truth but predicted once: IoU 0 (counts), Acc NaN (skipped);
    # class 3 neither present nor predicted: NaN in both (skipped)
    target = torch.tensor([[0, 0, 1, 1]])
    pred = torch.tensor([[0, 2, 1, 1]])
    res = SegMetric(4)
    res.update(pred, target)
    out = res.compute()
    assert out["IoU"][2] == 0.0 and math.isnan(out["Acc"][2])
    assert math.isnan(out["IoU"][3]) and math.isnan(out["Acc"][3])
    assert out["mIoU"] == pytest.approx(100 * (1 / 2 + 1 + 0) / 3)
    assert out["mAcc"] == pytest.approx(100 * (1 / 2 + 1) / 2)


def test_accumulates_over_batches_and_takes_logits():
    pred, target = _hand_case()
    logits = torch.nn.functional.one_hot(pred, 3).permute(2, 0, 1).float().unsqueeze(0)
    m = SegMetric(3)
    m.update(logits[:, :, :1], target[None, :1])
    m.update(pred[None, 1:], target[None, 1:])
    whole = SegMetric(3)
    whole.update(pred, target)
    assert torch.equal(m.conf, whole.conf)


def test_bad_inputs():
    pred, target = _hand_case()
    with pytest.raises(ValueError, match="outside the 2 classes"):
        confusion_matrix(pred, target, 2)
    with pytest.raises(ValueError, match="differ in shape"):
        confusion_matrix(pred[:1], target, 3)
    with pytest.raises(ValueError, match=r"predictions must lie in \[0, 3\)"):
        confusion_matrix(pred + 5, target, 3)
    assert math.isnan(metrics_from_confusion(torch.zeros(2, 2, dtype=torch.long))["mIoU"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, q) -> None:
    from inline_attn.runtime.distributed import cleanup, init_distributed

    torch.set_num_threads(1)
    info = init_distributed("cpu", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    try:
        pred, target = _hand_case()
        m = SegMetric(3)
        m.update(pred[rank : rank + 1], target[rank : rank + 1])  # each rank sees one row
        q.put((rank, m.compute(info)["mIoU"]))
    finally:
        cleanup(info)


def test_reduced_across_processes():
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(_rank, args=(2, _free_port(), q), nprocs=2, join=True, start_method="spawn")
    got = dict(q.get() for _ in range(2))
    pred, target = _hand_case()
    m = SegMetric(3)
    m.update(pred, target)
    assert got[0] == pytest.approx(m.compute()["mIoU"]) and got[1] == got[0]
