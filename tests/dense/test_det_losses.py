"""Focal and GIoU losses against float64 references written element by element from the papers."""

from __future__ import annotations

import math

import pytest
import torch

from inline_attn.dense.models.losses import giou_loss, sigmoid_focal_loss


def _focal_ref(x, t, alpha, gamma):
    """Lin et al. 2017, Eq. 5, one element at a time (torch scalars, so autograd gives the gradient)."""
    total = torch.zeros((), dtype=torch.float64)
    for xi, ti in zip(x.reshape(-1), t.reshape(-1).tolist()):
        p = 1 / (1 + torch.exp(-xi))
        p_t = p if ti == 1 else 1 - p
        a_t = (alpha if ti == 1 else 1 - alpha) if alpha >= 0 else 1.0
        total = total - a_t * (1 - p_t) ** gamma * torch.log(p_t)
    return total


def _giou_ref(a, b):
    """Rezatofighi et al. 2019, Alg. 1, one box pair at a time."""
    out = []
    for p, g in zip(a, b):
        ap = (p[2] - p[0]).clamp(min=0) * (p[3] - p[1]).clamp(min=0)
        ag = (g[2] - g[0]) * (g[3] - g[1])
        iw = (torch.minimum(p[2], g[2]) - torch.maximum(p[0], g[0])).clamp(min=0)
        ih = (torch.minimum(p[3], g[3]) - torch.maximum(p[1], g[1])).clamp(min=0)
        inter = iw * ih
        union = ap + ag - inter
        hull = (torch.maximum(p[2], g[2]) - torch.minimum(p[0], g[0])) * (
            torch.maximum(p[3], g[3]) - torch.minimum(p[1], g[1])
        )
        out.append(1 - (inter / union - (hull - union) / hull))
    return torch.stack(out)


@pytest.mark.parametrize("alpha,gamma", [(0.25, 2.0), (-1.0, 0.0), (0.5, 1.5)])
def test_focal_loss_matches_reference(alpha, gamma):
    g = torch.Generator().manual_seed(0)
    x64 = (torch.randn(7, 5, generator=g, dtype=torch.float64) * 3).requires_grad_()
    t = (torch.rand(7, 5, generator=g) < 0.3).float()
    ref = _focal_ref(x64, t, alpha, gamma)
    (gref,) = torch.autograd.grad(ref, x64)
    x32 = x64.detach().float().requires_grad_()
    out = sigmoid_focal_loss(x32, t, alpha, gamma)
    out.backward()
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x32.grad.double(), gref, rtol=1e-5, atol=1e-6)
    # float64 in, float64 out, agreeing to rounding
    torch.testing.assert_close(sigmoid_focal_loss(x64.detach(), t, alpha, gamma), ref.detach(), rtol=1e-12, atol=1e-12)


def test_focal_loss_extreme_logits_stay_finite():
    x = torch.tensor([[-100.0, 100.0]], requires_grad=True)
    loss = sigmoid_focal_loss(x, torch.tensor([[1.0, 0.0]]))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    with pytest.raises(ValueError, match="differ"):
        sigmoid_focal_loss(torch.zeros(2, 3), torch.zeros(3, 2))


def test_giou_loss_matches_reference():
    g = torch.Generator().manual_seed(1)
    xy = torch.rand(9, 2, generator=g, dtype=torch.float64) * 20
    gt = torch.cat([xy, xy + 1 + torch.rand(9, 2, generator=g, dtype=torch.float64) * 10], 1)
    pxy = xy + torch.randn(9, 2, generator=g, dtype=torch.float64) * 4
    pred64 = torch.cat([pxy, pxy + 1 + torch.rand(9, 2, generator=g, dtype=torch.float64) * 10], 1).requires_grad_()
    ref = _giou_ref(pred64, gt)
    (gref,) = torch.autograd.grad(ref.sum(), pred64)
    pred32 = pred64.detach().float().requires_grad_()
    out = giou_loss(pred32, gt.float())
    out.sum().backward()
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pred32.grad.double(), gref, rtol=1e-4, atol=1e-5)


def test_giou_known_values():
    box = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
    assert giou_loss(box, box).item() == pytest.approx(0.0, abs=1e-6)
    # disjoint unit boxes 1 apart: IoU 0, hull 3 x 1, union 2 -> GIoU = -1/3
    a, b = torch.tensor([[0.0, 0.0, 1.0, 1.0]]), torch.tensor([[2.0, 0.0, 3.0, 1.0]])
    assert giou_loss(a, b).item() == pytest.approx(1 + 1 / 3, abs=1e-6)
    # an empty predicted box inside the target: a finite loss and gradient
    p = torch.tensor([[1.0, 1.0, 1.0, 1.0]], requires_grad=True)
    loss = giou_loss(p, box)
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(p.grad).all()
    with pytest.raises(ValueError, match=r"\[N, 4\]"):
        giou_loss(torch.zeros(2, 4), torch.zeros(3, 4))
