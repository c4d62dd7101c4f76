"""Properties of the weights (paper Sec. 3-4): row sums, injectivity, confusion."""

from __future__ import annotations

import pytest
import torch

from inline_attn.ops import attention_weights


@pytest.mark.parametrize("feature_map", [None, "relu", "leakyrelu", "exp"])
def test_inline_rows_sum_to_one_without_division(feature_map):
    g = torch.Generator().manual_seed(0)
    q = 5 * torch.randn(2, 3, 40, 16, generator=g, dtype=torch.float64)
    k = 5 * torch.randn(2, 3, 40, 16, generator=g, dtype=torch.float64)
    w = attention_weights(q, k, kind="inline", feature_map=feature_map)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 40, dtype=torch.float64), rtol=0, atol=1e-12)


def test_linear_attention_confuses_scaled_queries_inline_does_not():
    """Linear attention: phi(2q) = 2 phi(q) for ReLU, so q and 2q get identical rows."""
    g = torch.Generator().manual_seed(1)
    k = torch.randn(1, 1, 20, 8, generator=g, dtype=torch.float64)
    q1 = torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64).abs() + 0.1  # ReLU keeps it
    q = torch.cat([q1, 2 * q1], dim=2)
    lin = attention_weights(q, k, kind="linear", eps=0.0)  # eps only guards the division
    torch.testing.assert_close(lin[..., 0, :], lin[..., 1, :], rtol=0, atol=1e-14)
    inl = attention_weights(q, k, kind="inline")
    assert (inl[..., 0, :] - inl[..., 1, :]).abs().max() > 1e-3


def test_inline_is_injective_when_centred_keys_span_the_space():
    """Identity feature map: w_i - w_j = scale/N * (q_i - q_j) . (K - k_bar)^T, zero only if q_i == q_j
    when the centred keys span R^d. Distinct random queries must give distinct rows."""
    g = torch.Generator().manual_seed(2)
    d, n = 8, 32
    k = torch.randn(1, 1, n, d, generator=g, dtype=torch.float64)
    centred = (k - k.mean(2, keepdim=True))[0, 0]
    assert torch.linalg.matrix_rank(centred) == d  # the premise
    q = torch.randn(1, 1, 50, d, generator=g, dtype=torch.float64)
    w = attention_weights(q, k, kind="inline")[0, 0]
    dist = torch.cdist(w, w)
    off_diag = dist[~torch.eye(50, dtype=torch.bool)]
    assert off_diag.min() > 1e-6
    # and a query difference along a direction orthogonal to every centred key is invisible
    # only when the keys do NOT span the space: keys confined to a d-1 subspace
    k_flat = k.clone()
    k_flat[..., -1] = 0.0
    e = torch.zeros(1, 1, 1, d, dtype=torch.float64)
    e[..., -1] = 1.0
    w2 = attention_weights(torch.cat([q[..., :1, :], q[..., :1, :] + e], 2), k_flat, kind="inline")
    torch.testing.assert_close(w2[..., 0, :], w2[..., 1, :], rtol=0, atol=1e-14)


def test_softmax_distinguishes_collinear_queries():
    g = torch.Generator().manual_seed(3)
    k = torch.randn(1, 1, 20, 8, generator=g, dtype=torch.float64)
    q1 = torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64)
    w = attention_weights(torch.cat([q1, 2 * q1], 2), k, kind="softmax")
    assert (w[..., 0, :] - w[..., 1, :]).abs().max() > 1e-3


@pytest.mark.parametrize("feature_map", ["identity", "relu", "leakyrelu", "exp", "affine_relu", "affine_relu_bias"])
def test_each_feature_map_confuses_q_and_2q_in_linear_attention_only_when_homogeneous(feature_map):
    """Linear attention gives q and 2q identical rows whenever phi(2q) = 2 phi(q) (identity, ReLU,
    LeakyReLU, relu(A x) without bias); InLine gives them different rows for every feature map."""
    from inline_attn.layers import AffineReLUFeatureMap

    g = torch.Generator().manual_seed(4)
    k = torch.randn(1, 1, 24, 8, generator=g, dtype=torch.float64).abs() + 0.05  # positive keys keep
    q1 = torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64).abs() + 0.1  # every feature map's sums > 0
    phi = feature_map
    if feature_map.startswith("affine_relu"):
        phi = AffineReLUFeatureMap(8).double()
        with torch.no_grad():
            phi.affine.weight.add_(0.1 * torch.randn(8, 8, generator=g, dtype=torch.float64)).abs_()
            if feature_map == "affine_relu_bias":
                phi.affine.bias.fill_(0.5)
    q = torch.cat([q1, 2 * q1], dim=2)
    with torch.no_grad():
        lin = attention_weights(q, k, kind="linear", feature_map=phi, eps=0.0)
        inl = attention_weights(q, k, kind="inline", feature_map=phi)
    gap_linear = (lin[..., 0, :] - lin[..., 1, :]).abs().max().item()
    gap_inline = (inl[..., 0, :] - inl[..., 1, :]).abs().max().item()
    print(feature_map, "linear row gap", gap_linear, "InLine row gap", gap_inline)
    if feature_map in ("exp", "affine_relu_bias"):
        assert gap_linear > 1e-4
    else:
        assert gap_linear < 1e-14
    assert gap_inline > 1e-4
