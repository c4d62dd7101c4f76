"""Bad input raises a ValueError that names the value and what was expected."""

from __future__ import annotations

import pytest
import torch

from inline_attn.layers import InLineAttention, LocalResidual, build_attention
from inline_attn.ops import attention, attention_weights, inline_tokens, local_residual


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
