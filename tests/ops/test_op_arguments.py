"""The ops' arguments are checked the same way on every path: ``scale`` is a positive real (and linear
attention takes none), a feature map keeps its input's shape, and ``why_not_fused`` refuses what the
call it describes refuses, with the same message."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from inline_attn.ops import attention, attention_weights, inline_tokens, why_not_fused

Q = torch.randn(1, 2, 5, 4, dtype=torch.float64)
PATHS = ["naive", "eager"]


@pytest.mark.parametrize("impl", PATHS)
@pytest.mark.parametrize("kind", ["inline", "softmax"])
@pytest.mark.parametrize("scale", ["0.5", True, False, 0, 0.0, -1.0, math.nan, math.inf, torch.tensor(0.5), [0.5]])
def test_a_scale_that_is_not_a_positive_real_is_refused(kind, impl, scale):
    with pytest.raises(ValueError, match=r"scale=.*: expected a positive real number"):
        attention(Q, Q, Q, kind=kind, scale=scale, impl=impl)


@pytest.mark.parametrize("scale", ["0.5", True, 0.0, -2, math.nan])
def test_inline_tokens_and_the_weights_refuse_the_same_scales(scale):
    x = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match=r"scale=.*: expected a positive real number"):
        inline_tokens(x, x, x, num_heads=2, feat_size=(2, 2), scale=scale)
    with pytest.raises(ValueError, match=r"scale=.*: expected a positive real number"):
        attention_weights(Q, Q, scale=scale)


@pytest.mark.parametrize("scale", [0.3, 2, np.float32(0.25), np.float64(1.0)])  # D**-0.5 = 0.5 is the default
@pytest.mark.parametrize("impl", PATHS)
def test_a_positive_real_scale_is_used(scale, impl):
    # neighbours of the refused values: ints and numpy reals work, and the scale changes the result
    out = attention(Q, Q, Q, scale=scale, impl=impl)
    ref = attention(Q, Q, Q, scale=float(scale), impl="naive")
    assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(out, attention(Q, Q, Q, impl="naive"))


def test_a_scale_that_changes_between_compiles_keeps_the_graph_whole():
    """Dynamo makes a float that changed between compiles symbolic (automatic dynamic); the scale
    check must not call math.isfinite on it, or every later compile of a layer breaks its graph."""
    q = torch.randn(1, 6, 8)  # 2 heads of 4 on a 2 x 3 grid

    def layer(q, scale):
        return inline_tokens(q, q, q, num_heads=2, feat_size=(2, 3), scale=scale)

    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    for scale in (0.25, 0.5, 0.75):
        torch.testing.assert_close(compiled(q, scale), layer(q, scale))


@pytest.mark.parametrize("impl", PATHS)
def test_linear_attention_refuses_a_scale_it_would_ignore(impl):
    with pytest.raises(ValueError, match=r"scale=0.5: linear attention takes no scale"):
        attention(Q, Q, Q, kind="linear", scale=0.5, impl=impl)
    with pytest.raises(ValueError, match=r"scale=0.5: linear attention takes no scale"):
        attention_weights(Q, Q, kind="linear", scale=0.5)
    assert torch.isfinite(attention(Q, Q, Q, kind="linear", impl=impl)).all()  # None: fine


def _widen(x):
    return torch.cat([x, x], dim=-1)


def _narrow(x):
    return x[..., :2]


@pytest.mark.parametrize("impl", PATHS)
@pytest.mark.parametrize("kind", ["inline", "linear"])
@pytest.mark.parametrize("phi", [_widen, _narrow, lambda x: x.sum(-1), lambda x: 3.0])
def test_a_feature_map_that_changes_the_shape_is_refused(kind, impl, phi):
    with pytest.raises(ValueError, match=r"feature_map .* turned [qk] of shape \(1, 2, 5, 4\) into .*keep the shape"):
        attention(Q, Q, Q, kind=kind, feature_map=phi, impl=impl)


@pytest.mark.parametrize("impl", PATHS)
def test_a_shape_keeping_feature_map_callable_is_used(impl):
    out = attention(Q, Q, Q, feature_map=torch.nn.functional.elu, impl=impl)
    ref = attention(Q, Q, Q, feature_map=torch.nn.functional.elu, impl="naive")
    assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12)


X = torch.randn(1, 5, 6)


@pytest.mark.parametrize(
    "q, kwargs, message",
    [
        (X, dict(num_heads=4), r"C=6 must be a positive multiple of num_heads=4"),
        (X, dict(num_heads=0), r"C=6 must be a positive multiple of num_heads=0"),
        (X, dict(num_heads=2.0), r"num_heads must be an int"),
        (X[..., :0], dict(num_heads=1), r"the channel count C must be positive"),
        (X, dict(num_heads=2, feat_size=(2, 2)), r"token count N=5 does not match"),
        (X, dict(num_heads=2, feat_size=(2, 2), num_prefix_tokens=2), r"token count N=5 does not match"),
        (X, dict(feature_map="gelu"), r"unknown feature map 'gelu'"),
        (X.int(), dict(), r"q must have a floating-point dtype"),
        (X[0], dict(), r"q must be \[B, N, C\]"),
    ],
)
def test_why_not_fused_refuses_what_the_call_refuses(q, kwargs, message):
    with pytest.raises(ValueError, match=message):
        why_not_fused(q, **kwargs)
    call = dict(
        num_heads=2, feat_size=(5, 1), **{k: v for k, v in kwargs.items() if k not in ("num_heads", "feat_size")}
    )
    call.update({k: v for k, v in kwargs.items() if k in ("num_heads", "feat_size")})
    k = q if q.dim() != 3 or not q.is_floating_point() else q.clone()
    with pytest.raises(ValueError, match=message):
        inline_tokens(q, k, k, **call)


def test_why_not_fused_answers_for_what_the_call_takes():
    assert (
        why_not_fused(X, num_heads=2, feat_size=(1, 4), num_prefix_tokens=1, impl="eager")
        == "impl='eager' was asked for"
    )
    reason = why_not_fused(X, num_heads=3, feat_size=(5, 1))
    assert reason is None or isinstance(reason, str)  # None where the C++ kernel is built, else its reason
    out = inline_tokens(X, X, X, num_heads=3, feat_size=(5, 1))
    assert out.shape == X.shape


@pytest.mark.parametrize("mode", [{}, {"is_causal": True}, {"key_padding_mask": torch.zeros(1, 5, dtype=torch.bool)}])
@pytest.mark.parametrize("scale", ["0.5", True, -1.0, math.nan])
def test_the_sdpa_shaped_op_refuses_the_same_scales_in_every_mode(mode, scale):
    from inline_attn.ops import inline_attention

    q = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match="scale="):
        inline_attention(q, q, q, scale=scale, **mode)


@pytest.mark.parametrize("mode", [{"is_causal": True}, {"key_padding_mask": torch.zeros(1, 5, dtype=torch.bool)}])
def test_the_sdpa_shaped_ops_refuse_a_feature_map_that_changes_the_shape(mode):
    from inline_attn.ops import inline_attention, inline_state, linear_attention

    q = torch.randn(1, 2, 5, 4)
    for op in (inline_attention, linear_attention):
        with pytest.raises(ValueError, match="must keep the shape"):
            op(q, q, q, feature_map=lambda x: x[..., :2], **mode)
    with pytest.raises(ValueError, match="must keep the shape"):
        inline_state(q, q, feature_map=lambda x: x[..., :2])
