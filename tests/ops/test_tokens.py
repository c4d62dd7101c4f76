"""``ops.inline_tokens`` (the InLine layer core) and its fused C++ CPU kernel against the naive reference.

The kernels (``ops/fused/csrc/inline_cpu.cpp``, forward and backward, through the custom op
``inline_attn::inline_forward`` with ``backend="cpu"``) are compared in float64 with the
explicit-weights reference on awkward shapes (batch 1, odd N, H != W, prefix tokens, one head, a
1x1 grid, strided views from fused and split projections), with and without the residual and for
both task layouts (per head and per sample): outputs and gradients, plus gradcheck. The eager path
is compared with the reference as well. The Triton backend has its own file (test_triton.py).
"""

from __future__ import annotations

import pytest
import torch

from inline_attn.layers import InLineAttention
from inline_attn.ops import inline_tokens, use_impl
from inline_attn.ops.fused import cpu as cpu_kernel
from inline_attn.ops import tokens as tokens_mod

# (B, H, W, C, heads, prefix)
SHAPES = [
    (1, 5, 3, 24, 2, 1),
    (3, 7, 7, 96, 3, 0),
    (2, 4, 9, 30, 5, 2),
    (1, 1, 1, 8, 1, 0),
    (9, 3, 5, 12, 4, 1),
    (1, 14, 14, 64, 4, 1),
]


def _ids(s):
    return "B{}_{}x{}_C{}_h{}_p{}".format(*s)


def _inputs(shape, layout, dtype=torch.float64, requires_grad=False):
    b, h, w, c, heads, p = shape
    n = p + h * w
    if layout == "fused":  # views into one [B, N, 3C] qkv projection
        qkv = torch.randn(b, n, 3 * c, dtype=dtype, requires_grad=requires_grad)
        q, k, v = qkv.chunk(3, dim=-1)
        leaves = [qkv]
    else:  # PVT's separate q and kv projections
        qt = torch.randn(b, n, c, dtype=dtype, requires_grad=requires_grad)
        kv = torch.randn(b, n, 2 * c, dtype=dtype, requires_grad=requires_grad)
        q, (k, v) = qt, kv.chunk(2, dim=-1)
        leaves = [qt, kv]
    weights = torch.randn(b, c, 3, 3, dtype=dtype, requires_grad=requires_grad)
    return q, k, v, weights, leaves


@pytest.fixture
def kernel_calls(monkeypatch):
    """Records the backend of every call that reaches the fused op."""
    calls = []
    for name in ("inline_core", "inline_layer_core"):  # the core alone, and with the layer's residual predictor

        def spy(*args, real=getattr(tokens_mod, name)):
            calls.append(args[-1])
            return real(*args)

        monkeypatch.setattr(tokens_mod, name, spy)
    return calls


def test_cpu_kernel_builds_on_this_machine():
    # g++ and ninja are on every machine of this project; a failed build would silently cost speed
    assert cpu_kernel.cpu_kernel_available(), cpu_kernel.cpu_kernel_error()


@pytest.mark.parametrize("layout", ["fused", "split"])
@pytest.mark.parametrize("residual", [True, False], ids=["res", "nores"])
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_fused_kernel_matches_naive_float64(shape, residual, layout, kernel_calls):
    b, h, w, c, heads, p = shape
    q, k, v, weights, _ = _inputs(shape, layout)
    weights = weights if residual else None
    kw = dict(num_heads=heads, feat_size=(h, w), residual_weights=weights, num_prefix_tokens=p)
    with torch.no_grad():
        fast = inline_tokens(q, k, v, **kw)
        ref = inline_tokens(q, k, v, impl="naive", **kw)
    assert kernel_calls == ["cpu"], "the fused CPU kernel was not used for a float64 inference call"
    assert fast.shape == (b, p + h * w, c) and fast.is_contiguous()
    torch.testing.assert_close(fast, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 2])
def test_fused_kernel_float32_close_to_float64_reference(threads, kernel_calls):
    # both task layouts: 2 samples x 6 heads -> per-head tasks; 32 samples -> whole-sample tasks
    torch.set_num_threads(threads)
    for shape in [(2, 7, 7, 96, 6, 0), (32, 7, 7, 96, 3, 0), (4, 14, 14, 192, 3, 1)]:
        q, k, v, weights, _ = _inputs(shape, "fused")
        kw = dict(num_heads=shape[4], feat_size=shape[1:3], residual_weights=weights, num_prefix_tokens=shape[5])
        with torch.inference_mode():
            ref = inline_tokens(q, k, v, impl="naive", **kw)
            fast = inline_tokens(q.float(), k.float(), v.float(), **{**kw, "residual_weights": weights.float()})
            eager = inline_tokens(
                q.float(), k.float(), v.float(), impl="eager", **{**kw, "residual_weights": weights.float()}
            )
        err_fast = ((fast.double() - ref).abs().max() / ref.abs().max()).item()
        err_eager = ((eager.double() - ref).abs().max() / ref.abs().max()).item()
        print(f"{shape} threads={threads}: float32 rel err fused {err_fast:.2e}, eager {err_eager:.2e}")
        # flash-attention's rule: the fast path's error within 2x that of the eager float32 path
        assert err_fast <= 2 * err_eager and err_eager < 1e-6
    assert len(kernel_calls) == 3


@pytest.mark.parametrize("impl", ["auto", "eager"])
@pytest.mark.parametrize("layout", ["fused", "split"])
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_gradients_match_naive(shape, layout, impl, kernel_calls):
    b, h, w, c, heads, p = shape
    q, k, v, weights, leaves = _inputs(shape, layout, requires_grad=True)
    kw = dict(num_heads=heads, feat_size=(h, w), residual_weights=weights, num_prefix_tokens=p)
    out = inline_tokens(q, k, v, impl=impl, **kw)
    ref = inline_tokens(q, k, v, impl="naive", **kw)
    assert kernel_calls == (["cpu"] if impl == "auto" else [])
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(ref)
    got = torch.autograd.grad(out, leaves + [weights], g)
    want = torch.autograd.grad(ref, leaves + [weights], g)
    for name, a, r in zip(["inputs"] * len(leaves) + ["weights"], got, want):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11, msg=lambda m: f"grad of {name}: {m}")


def test_fused_backward_gradcheck_and_no_residual():
    for residual in (True, False):
        q, k, v, weights, leaves = _inputs((2, 3, 4, 12, 3, 1), "fused", requires_grad=True)
        wts = weights if residual else None

        def fn(qkv, wt):
            q, k, v = qkv.chunk(3, dim=-1)
            return inline_tokens(q, k, v, num_heads=3, feat_size=(3, 4), residual_weights=wt, num_prefix_tokens=1)

        assert torch.autograd.gradcheck(fn, (leaves[0], wts))


def test_non_unit_channel_stride_is_copied_and_kernels_fall_back_to_eager(kernel_calls):
    b, h, w, c, heads, p = 2, 3, 4, 12, 3, 1
    x = torch.randn(b, 3 * c, p + h * w, dtype=torch.float64)
    q, k, v = x.transpose(1, 2).chunk(3, dim=-1)  # channel stride != 1: the op copies it
    kw = dict(num_heads=heads, feat_size=(h, w), num_prefix_tokens=p)
    with torch.no_grad():
        torch.testing.assert_close(inline_tokens(q, k, v, **kw), inline_tokens(q, k, v, impl="naive", **kw))
        assert kernel_calls == ["cpu"]
        for feature_map in ("relu", "exp"):
            out = inline_tokens(q, k, v, feature_map=feature_map, **kw)
            torch.testing.assert_close(out, inline_tokens(q, k, v, feature_map=feature_map, impl="naive", **kw))
        with use_impl("eager"):
            inline_tokens(q.contiguous(), k.contiguous(), v.contiguous(), **kw)
    assert kernel_calls == ["cpu"]


def test_layer_same_output_with_and_without_kernel():
    layer = InLineAttention(48, 3, num_prefix_tokens=1).eval()
    x = torch.randn(4, 1 + 6 * 5, 48)
    with torch.inference_mode():
        with use_impl("cpu"):
            fused = layer(x, (6, 5))
        with use_impl("eager"):
            eager = layer(x, (6, 5))
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["auto", "eager"])
def test_layer_under_bf16_autocast_stays_finite_and_close(impl, kernel_calls):
    # under CPU bf16 autocast the projections give bf16 q, k, v; the fused kernel sums in float32
    layer = InLineAttention(32, 2).eval()
    x = 30 * torch.randn(2, 64, 32)
    with torch.inference_mode(), use_impl(impl):
        ref = layer(x, (8, 8))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = layer(x, (8, 8))
    assert kernel_calls == (["cpu", "cpu"] if impl == "auto" else [])
    assert low.dtype == torch.bfloat16 and torch.isfinite(low).all()
    rel = ((low.float() - ref).abs().max() / ref.abs().max()).item()
    assert rel < 0.05, rel  # bf16 has 8 mantissa bits; the projections run in bf16


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_heads=5), "multiple of num_heads"),
        (dict(feat_size=(3, 3)), "token count"),
        (dict(residual_weights=torch.randn(2, 12, 3)), "residual_weights"),
        (dict(impl="cuda"), "unknown impl"),
    ],
)
def test_bad_input_raises_value_error(kwargs, match):
    q, k, v = torch.randn(2, 13, 36).chunk(3, dim=-1)
    args = dict(num_heads=3, feat_size=(3, 4), num_prefix_tokens=1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        inline_tokens(q, k, v, **args)
    with pytest.raises(ValueError, match="q's shape"):
        inline_tokens(q, k[:, :5], v, num_heads=3, feat_size=(3, 4), num_prefix_tokens=1)


def test_flop_counter_counts_kernel_like_eager():
    from torch.utils.flop_counter import FlopCounterMode

    layer = InLineAttention(48, 3, num_prefix_tokens=1).eval()
    x = torch.randn(2, 1 + 7 * 5, 48)
    counts = []
    for impl in ("cpu", "eager"):
        counter = FlopCounterMode(display=False)
        with use_impl(impl), torch.no_grad(), counter:
            layer(x, (7, 5))
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] > 0


def test_fused_kernel_reads_batch_strided_views(kernel_calls):
    # every other sample of a bigger qkv buffer: batch stride 2 * N * 3C, token stride 3C
    b, h, w, c, heads, p = 6, 4, 5, 24, 3, 1
    qkv = torch.randn(b, p + h * w, 3 * c, dtype=torch.float64)[::2]
    q, k, v = qkv.chunk(3, dim=-1)
    weights = torch.randn(3, c, 3, 3, dtype=torch.float64)
    kw = dict(num_heads=heads, feat_size=(h, w), residual_weights=weights, num_prefix_tokens=p)
    with torch.no_grad():
        fast = inline_tokens(q, k, v, **kw)
        ref = inline_tokens(q, k, v, impl="naive", **kw)
    assert kernel_calls
    torch.testing.assert_close(fast, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", ["naive", "eager", "cpu", "auto"])
def test_layer_core_checks_and_chooses_once_per_call(impl, monkeypatch):
    # the layer's host path: one dispatch decision and no token re-check on any path (fallback included)
    counts = {"choose": 0, "check_tokens": 0}

    def counting(name, real):
        def spy(*args, **kwargs):
            counts[name] += 1
            return real(*args, **kwargs)

        return spy

    monkeypatch.setattr(tokens_mod.dispatch, "choose", counting("choose", tokens_mod.dispatch.choose))
    monkeypatch.setattr(tokens_mod, "check_tokens", counting("check_tokens", tokens_mod.check_tokens))
    layer = InLineAttention(24, 3, num_prefix_tokens=1).double()
    x = torch.randn(2, 1 + 3 * 5, 24, dtype=torch.float64)
    q, k, v = layer.qkv(x).chunk(3, dim=-1)
    args = (layer.residual.predictor_params(), 3, (3, 5), 1, None, 8**-0.5, impl)
    out = tokens_mod.layer_core_tokens(x, q, k, v, *args)
    assert counts == {"choose": 1, "check_tokens": 0}
    counts.update(choose=0)
    weights = layer.residual.predict(x.mean(dim=1))
    ref = inline_tokens(q, k, v, num_heads=3, feat_size=(3, 5), residual_weights=weights, num_prefix_tokens=1)
    assert counts == {"choose": 1, "check_tokens": 1}
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", ["naive", "eager", "cpu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=["bf16", "f64"])
def test_layer_core_refuses_x_of_another_dtype_than_the_predictor_on_every_impl(dtype, impl):
    # outside autocast an nn.Linear refuses such an input; impl="cpu" ran it and the others failed in baddbmm
    layer = InLineAttention(24, 3, num_prefix_tokens=1)  # float32 parameters
    x = torch.randn(2, 1 + 3 * 5, 24, dtype=dtype)
    args = dict(predictor=layer.residual.predictor_params(), num_heads=3, feat_size=(3, 5), num_prefix_tokens=1)
    with pytest.raises(ValueError, match=rf"x is {dtype} and the predictor's parameters are torch.float32"):
        tokens_mod.inline_layer_tokens(x, x, x, x, impl=impl, **args)
    # under autocast x's token mean is cast to the predictor's dtype: the impls agree
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = tokens_mod.inline_layer_tokens(x, x, x, x, impl=impl, **args)
        ref = tokens_mod.inline_layer_tokens(x, x, x, x, impl="naive", **args)
    torch.testing.assert_close(out.float(), ref.float(), rtol=0.05, atol=0.05)


def test_layer_core_refuses_predictor_tensors_of_mixed_dtypes():
    layer = InLineAttention(24, 3)
    w1, b1, w2, b2 = layer.residual.predictor_params()
    x = torch.randn(2, 9, 24)
    with pytest.raises(
        ValueError, match=r"share one dtype on x's device cpu, got w1 torch.float32 and b2 torch.float64"
    ):
        tokens_mod.inline_layer_tokens(x, x, x, x, predictor=(w1, b1, w2, b2.double()), num_heads=3, feat_size=(3, 3))


def test_numpy_integer_num_heads_is_a_size_as_elsewhere():
    np = pytest.importorskip("numpy")
    q, k, v = torch.randn(2, 13, 36, dtype=torch.float64).chunk(3, dim=-1)
    args = dict(feat_size=(3, 4), num_prefix_tokens=1)
    want = inline_tokens(q, k, v, num_heads=3, **args)
    for impl in ("naive", "eager", "cpu"):
        got = inline_tokens(q, k, v, num_heads=np.int64(3), impl=impl, **args)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
