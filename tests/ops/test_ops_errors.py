"""Bad input raises a ValueError that names the value and what was expected."""

from __future__ import annotations

import pytest
import torch

from inline_attn.layers import InLineAttention, LocalResidual, build_attention
from inline_attn.ops import attention, attention_weights, inline_tokens, local_residual, softmax_attention


def test_wrong_rank():
    q = torch.randn(2, 10, 8)
    with pytest.raises(ValueError, match=r"rank 4.*\(2, 10, 8\)"):
        attention(q, q, q)


def test_mismatched_heads_or_dims():
    q = torch.randn(1, 2, 10, 8)
    with pytest.raises(ValueError, match="must agree"):
        attention(q, torch.randn(1, 3, 10, 8), torch.randn(1, 3, 10, 8))
    with pytest.raises(ValueError, match="must agree"):
        attention(q, q, torch.randn(1, 2, 11, 8))


def test_unknown_feature_map_kind_and_impl():
    q = torch.randn(1, 1, 4, 4)
    with pytest.raises(ValueError, match="unknown feature map 'gelu'"):
        attention(q, q, q, feature_map="gelu")
    with pytest.raises(ValueError, match="unknown attention kind 'cosine'"):
        attention_weights(q, q, kind="cosine")
    with pytest.raises(ValueError, match="unknown impl"):
        attention(q, q, q, impl="triton9")
    with pytest.raises(ValueError, match="unknown feature map"):
        build_attention("inline", 8, 2, feature_map="gelu")
    with pytest.raises(ValueError, match="softmax attention only"):
        attention(q, q, q, kind="inline", bias=torch.zeros(4, 4))


def test_layer_token_count_must_match_grid():
    layer = build_attention("inline", 16, 2, num_prefix_tokens=1)
    with pytest.raises(ValueError, match=r"N=50 does not match .* 1 \+ 7\*7 = 50|N=49 does not match"):
        layer(torch.randn(1, 49, 16), (7, 7))
    with pytest.raises(ValueError, match=r"N=10 .* 1 \+ 3\*4 = 13"):
        layer(torch.randn(1, 10, 16), (3, 4))


@pytest.mark.parametrize("hw", [(0, 4), (4, -1)])
def test_layer_nonpositive_grid(hw):
    layer = build_attention("inline", 16, 2)
    with pytest.raises(ValueError, match="feat_size must be positive"):
        layer(torch.randn(1, 4, 16), hw)


def test_layer_wrong_rank_and_channels():
    layer = build_attention("softmax", 16, 2)
    with pytest.raises(ValueError, match=r"x must be \[B, N, 16\]"):
        layer(torch.randn(4, 16), (2, 2))
    with pytest.raises(ValueError, match=r"x must be \[B, N, 16\]"):
        layer(torch.randn(1, 4, 12), (2, 2))


@pytest.mark.parametrize("kind", ["inline", "linear", "softmax"])
def test_dim_not_divisible_by_heads(kind):
    with pytest.raises(ValueError, match="dim=10 must be a positive multiple of num_heads=3"):
        build_attention(kind, 10, 3)


def test_residual_weight_shapes():
    with pytest.raises(ValueError, match=r"weights must have shape \(1, 4, 3, 3\)"):
        local_residual(torch.randn(1, 4, 5, 5), torch.randn(1, 4, 9))
    with pytest.raises(ValueError, match=r"context must be \[B, 8\]"):
        LocalResidual(8, 2).predict(torch.randn(2, 4))


@pytest.mark.parametrize("hw", [(4.5, 4), (4.0, 4), (4, "4"), (16,), 16])
def test_feat_size_must_be_a_pair_of_ints_not_truncated(hw):
    layer = build_attention("inline", 12, 3)
    with pytest.raises(ValueError, match=r"feat_size must be a pair \(H, W\) of ints, got "):
        layer(torch.randn(1, 16, 12), hw)
    q = torch.randn(1, 16, 12)
    with pytest.raises(ValueError, match=r"feat_size must be a pair \(H, W\) of ints"):
        inline_tokens(q, q, q, num_heads=3, feat_size=hw)


def test_num_prefix_tokens_must_be_an_int():
    with pytest.raises(ValueError, match=r"num_prefix_tokens must be an int >= 0, got 0.0 \(float\)"):
        build_attention("inline", 12, 3, num_prefix_tokens=0.0)
    with pytest.raises(ValueError, match=r"num_prefix_tokens must be >= 0, got -1"):
        build_attention("softmax", 12, 3, num_prefix_tokens=-1)
    q = torch.randn(1, 17, 12)
    with pytest.raises(ValueError, match=r"num_prefix_tokens must be an int >= 0, got 1.0"):
        inline_tokens(q, q, q, num_heads=3, feat_size=(4, 4), num_prefix_tokens=1.0)


@pytest.mark.parametrize(
    "args,match",
    [
        ((12.0, 3), r"dim must be an int >= 1, got 12.0 \(float\)"),
        ((12, 3.0), r"num_heads must be an int >= 1, got 3.0"),
    ],
)
def test_layer_sizes_must_be_ints(args, match):
    with pytest.raises(ValueError, match=match):
        InLineAttention(*args)


def test_integer_likes_are_sizes():
    np = pytest.importorskip("numpy")
    layer = build_attention("inline", 12, 3, num_prefix_tokens=np.int64(1))
    assert layer(torch.randn(1, 17, 12), (np.int64(4), 4)).shape == (1, 17, 12)


def test_softmax_attention_refuses_a_feature_map():
    # issue 36: attention(kind="softmax", feature_map="relu") ignored the feature map
    q = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match="feature_map applies to inline and linear attention, got 'relu'"):
        attention(q, q, q, kind="softmax", feature_map="relu")


SOFTMAX_Q = torch.randn(1, 2, 4, 8, dtype=torch.float64)


@pytest.mark.parametrize("impl", ["eager", "naive"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8])
def test_softmax_refuses_an_integer_mask_rather_than_adding_it(dtype, impl):
    # an integer keep-mask was added to the scores as 0 / 1, so every key stayed attended
    q = SOFTMAX_Q
    mask = torch.tensor([[1, 1, 0, 0]] * 4, dtype=dtype)
    match = rf"mask must be bool \(True = attend\) or floating \(added to the scores\), got {dtype}"
    with pytest.raises(ValueError, match=match):
        attention(q, q, q, kind="softmax", mask=mask, impl=impl)
    with pytest.raises(ValueError, match=match):
        attention_weights(q, q, kind="softmax", mask=mask)
    with pytest.raises(ValueError, match=match):
        softmax_attention(q, q, q, mask=mask, is_causal=True)
    with pytest.raises(ValueError, match=r"bias must be floating \(added to the scores\), got torch.bool"):
        attention(q, q, q, kind="softmax", bias=mask.bool(), impl=impl)


@pytest.mark.parametrize("impl", ["eager", "naive"])
def test_softmax_refuses_a_mask_or_bias_on_another_device(impl):
    # a meta mask was silently ignored (the unmasked output), a meta bias gave an undefined output
    q = SOFTMAX_Q
    for name, t in (("mask", torch.ones(4, 4, dtype=torch.bool)), ("bias", torch.zeros(4, 4, dtype=q.dtype))):
        with pytest.raises(ValueError, match=rf"{name} must be on q's device cpu, got meta"):
            attention(q, q, q, kind="softmax", impl=impl, **{name: t.to("meta")})


@pytest.mark.parametrize("impl", ["eager", "naive"])
@pytest.mark.parametrize("name", ["mask", "bias"])
def test_softmax_refuses_a_mask_or_bias_that_does_not_broadcast(name, impl):
    q, k = SOFTMAX_Q, torch.randn(1, 2, 6, 8, dtype=torch.float64)
    dtype = torch.bool if name == "mask" else q.dtype
    match = rf"{name} of shape \(5, 5\) must broadcast to the scores \[B, H, Nq, Nk\] = \(1, 2, 4, 6\)"
    with pytest.raises(ValueError, match=match):
        attention(q, k, k, kind="softmax", impl=impl, **{name: torch.ones(5, 5, dtype=dtype)})
    too_many = rf"{name} of shape \(1, 1, 1, 4, 6\) must broadcast"
    with pytest.raises(ValueError, match=too_many):
        attention(q, k, k, kind="softmax", impl=impl, **{name: torch.ones(1, 1, 1, 4, 6, dtype=dtype)})
    # what broadcasts is taken: per head [H, 1, Nk], per sample [B, 1, 1, Nk]
    for shape in ((2, 1, 6), (1, 1, 1, 6), (4, 6)):
        t = torch.ones(shape, dtype=dtype)
        assert attention(q, k, k, kind="softmax", impl=impl, **{name: t}).shape == (1, 2, 4, 8)


def test_softmax_layer_names_a_mask_of_the_wrong_shape():
    layer = build_attention("softmax", 16, 2, num_prefix_tokens=1)
    with pytest.raises(ValueError, match=r"mask of shape \(5, 5\) must broadcast to the scores .* = \(2, 2, 13, 13\)"):
        layer(torch.randn(2, 13, 16), (3, 4), mask=torch.ones(5, 5, dtype=torch.bool))


@pytest.mark.parametrize("kind", ["inline", "linear"])
def test_a_feature_map_returning_integers_is_refused(kind):
    q = SOFTMAX_Q
    with pytest.raises(ValueError, match=r"feature_map <lambda> must return a floating tensor, got torch.int64"):
        attention(q, q, q, kind=kind, feature_map=lambda t: t.long())
