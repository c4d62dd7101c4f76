"""Fast paths vs the naive reference (float64): outputs and gradients on awkward shapes."""

from __future__ import annotations

import pytest
import torch

from inline_attn.ops import attention, attention_weights, local_residual, naive_local_residual

# (batch, heads, tokens, head_dim): batch 1, odd N, D not a power of two, a single token
SHAPES = [(1, 1, 63, 24), (2, 3, 63, 24), (1, 2, 17, 60), (3, 2, 1, 8), (2, 1, 196, 32)]
IDS = [f"B{b}-H{h}-N{n}-D{d}" for b, h, n, d in SHAPES]

CASES = [
    ("inline", None),
    ("inline", "relu"),
    ("inline", "leakyrelu"),
    ("inline", "exp"),
    ("linear", None),
    ("linear", "leakyrelu"),
    ("linear", "exp"),
    ("softmax", None),
]


def _qkv(shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("kind,feature_map", CASES, ids=[f"{k}-{c}" for k, c in CASES])
def test_fast_matches_naive_outputs_and_grads(shape, kind, feature_map):
    q, k, v = _qkv(shape)
    fast = attention(q, k, v, kind=kind, feature_map=feature_map)
    naive = attention(q, k, v, kind=kind, feature_map=feature_map, impl="naive")
    assert fast.shape == naive.shape == shape
    torch.testing.assert_close(fast, naive, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(fast)
    grads_fast = torch.autograd.grad(fast, (q, k, v), g)
    grads_naive = torch.autograd.grad(naive, (q, k, v), g)
    for name, a, b in zip("qkv", grads_fast, grads_naive):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=f"grad of {name}")


def test_inline_matches_reference_formula_with_scale_convention():
    """The reference code's scale: it multiplies phi(Q) by d^-0.5 / N before paper Eq. 5."""
    q, k, v = (t.detach() for t in _qkv((2, 2, 50, 16)))
    n, d = 50, 16
    s = d**-0.5
    kv = (k.transpose(-2, -1) * (s / n) ** 0.5) @ (v * (s / n) ** 0.5)
    ref = q @ kv + (1 - q @ k.mean(2, keepdim=True).transpose(-2, -1) * s) * v.mean(2, keepdim=True)
    torch.testing.assert_close(attention(q, k, v, kind="inline"), ref, rtol=1e-12, atol=1e-12)


def test_custom_scale_is_respected():
    q, k, v = (t.detach() for t in _qkv((1, 2, 20, 8)))
    for kind in ("inline", "softmax"):
        torch.testing.assert_close(
            attention(q, k, v, kind=kind, scale=0.3), attention(q, k, v, kind=kind, scale=0.3, impl="naive")
        )


def test_softmax_bias_and_masks_match_naive():
    q, k, v = (t.detach() for t in _qkv((2, 3, 25, 8)))
    bias = torch.randn(3, 25, 25, dtype=torch.float64)
    keep = torch.rand(2, 1, 25, 25) > 0.3
    keep[..., 0] = True  # every row keeps at least one key
    float_mask = torch.zeros(2, 1, 25, 25, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    for mask in (keep, float_mask):
        fast = attention(q, k, v, kind="softmax", bias=bias, mask=mask)
        naive = attention(q, k, v, kind="softmax", bias=bias, mask=mask, impl="naive")
        torch.testing.assert_close(fast, naive, rtol=1e-10, atol=1e-10)


def test_queries_and_keys_of_different_lengths():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, 7, 12, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 30, 12, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, 30, 5, generator=g, dtype=torch.float64)
    for kind in ("inline", "linear", "softmax"):
        torch.testing.assert_close(attention(q, k, v, kind=kind), attention(q, k, v, kind=kind, impl="naive"))


@pytest.mark.parametrize(
    "bchw", [(1, 1, 1, 1), (2, 5, 7, 9), (1, 96, 14, 14), (3, 4, 6, 2)], ids=lambda s: "x".join(map(str, s))
)
def test_local_residual_fast_matches_conv(bchw):
    b, c, h, w = bchw
    g = torch.Generator().manual_seed(2)
    v = torch.randn(b, c, h, w, generator=g, dtype=torch.float64, requires_grad=True)
    wt = torch.randn(b, c, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    fast, naive = local_residual(v, wt), naive_local_residual(v, wt)
    torch.testing.assert_close(fast, naive, rtol=1e-12, atol=1e-12)
    go = torch.randn_like(fast)
    for a, b_ in zip(torch.autograd.grad(fast, (v, wt), go), torch.autograd.grad(naive, (v, wt), go)):
        torch.testing.assert_close(a, b_, rtol=1e-10, atol=1e-10)


def test_local_residual_channels_last_view_input():
    """The layer passes V as a channels-last view of the token tensor: same result."""
    g = torch.Generator().manual_seed(3)
    tokens = torch.randn(2, 5 * 6, 8, generator=g, dtype=torch.float64)
    v = tokens.view(2, 5, 6, 8).permute(0, 3, 1, 2)
    wt = torch.randn(2, 8, 3, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(local_residual(v, wt), naive_local_residual(v.contiguous(), wt))


def test_gradcheck_float64():
    q, k, v = _qkv((1, 2, 9, 4))
    assert torch.autograd.gradcheck(lambda a, b, c: attention(a, b, c, kind="inline"), (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: attention(a, b, c, kind="inline", feature_map="exp"), (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: attention(a, b, c, kind="linear"), (q, k, v))
    vv = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    wt = torch.randn(2, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(local_residual, (vv, wt))


def test_weights_returned_by_attention_weights_reproduce_fast_outputs():
    q, k, v = (t.detach() for t in _qkv((2, 2, 31, 8)))
    for kind in ("inline", "linear", "softmax"):
        w = attention_weights(q, k, kind=kind)
        assert w.shape == (2, 2, 31, 31)
        torch.testing.assert_close(w @ v, attention(q, k, v, kind=kind))
