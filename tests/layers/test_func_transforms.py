"""torch.func through the layers' default path: per-sample gradients by ``vmap(grad(...))`` equal
a loop over the samples with ordinary autograd (which runs the fused kernel on CPU)."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, grad, vmap

from inline_attn import create_model
from inline_attn.layers import InLineAttention
from inline_attn.ops import dispatch, inline_tokens, why_not_fused


def test_a_transform_takes_the_eager_path_with_a_reason():
    q = torch.randn(2, 13, 12)
    assert why_not_fused(q) is None  # the fused kernel outside the transform
    seen = []

    def f(q):
        seen.append(dispatch.choose(q))
        return inline_tokens(q, q, q, num_heads=3, feat_size=(3, 4), num_prefix_tokens=1).sum()

    grad(f)(q)
    reason = "a torch.func transform (grad, vmap, ...) is active and the fused op has no functorch rule"
    assert seen == [("eager", reason)]
    with pytest.raises(ValueError, match="torch.func transform"):  # an explicit fused impl cannot run there
        grad(lambda q: inline_tokens(q, q, q, num_heads=3, feat_size=(3, 4), impl="cpu").sum())(q[:, 1:])


def per_sample_grads(model, x, y):
    """{name: [B, *shape]} gradients of each sample's loss: vmap over grad, and a loop."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        out = functional_call(model, p, (xi[None],))
        return torch.nn.functional.cross_entropy(out, yi[None])

    vmapped = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    looped = {k: [] for k in params}
    for xi, yi in zip(x, y):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(xi[None]), yi[None]).backward()
        for k, v in model.named_parameters():
            looped[k].append(v.grad.clone())
    return vmapped, {k: torch.stack(v) for k, v in looped.items()}


class LayerThenHead(torch.nn.Module):
    """An InLine layer over a 3 x 5 grid, then a classifier on the mean token."""

    def __init__(self, prefix: int):
        super().__init__()
        self.attn = InLineAttention(12, 3, num_prefix_tokens=prefix)
        self.head = torch.nn.Linear(12, 4)

    def forward(self, x):
        return self.head(self.attn(x, (3, 5)).mean(dim=1))


@pytest.mark.parametrize("prefix", [0, 1])
def test_per_sample_gradients_of_a_layer_equal_the_loop(prefix):
    torch.manual_seed(0)
    x, y = torch.randn(3, prefix + 15, 12), torch.tensor([0, 3, 1])
    vmapped, looped = per_sample_grads(LayerThenHead(prefix), x, y)
    for k in looped:
        torch.testing.assert_close(vmapped[k], looped[k], rtol=1e-4, atol=1e-6, msg=k)


def test_per_sample_gradients_of_a_model_equal_the_loop():
    torch.manual_seed(0)
    kw = dict(img_size=16, patch_size=4, embed_dim=12, depth=1, num_heads=3, num_classes=3)
    model = create_model("inline_deit_tiny", **kw)
    x, y = torch.randn(2, 3, 16, 16), torch.tensor([2, 0])
    vmapped, looped = per_sample_grads(model, x, y)
    for k in looped:
        torch.testing.assert_close(vmapped[k], looped[k], rtol=1e-4, atol=1e-6, msg=k)
