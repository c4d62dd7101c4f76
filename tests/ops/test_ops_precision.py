"""Low precision: fp16 / bf16 autocast on large-magnitude inputs at N = 12544 (a 112 x 112 grid).

Tolerance rule (flash-attention style, made stricter): the error of the fast path against a
float64 reference computed from the same low-precision inputs must stay within twice the error of
simply rounding that exact answer to the low-precision dtype, i.e. the unavoidable output
rounding. A plain low-precision evaluation of the reference formula is printed for contrast (with
these magnitudes its D x D key-value sum overflows fp16).
"""

from __future__ import annotations

import pytest
import torch

from inline_attn.layers import build_attention
from inline_attn.ops import attention

N = 12544


def _large_inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (1, 2, N, 32)
    q = 50 * torch.randn(shape, generator=g) + 20
    k = 50 * torch.randn(shape, generator=g) + 20
    v = 50 * torch.randn(shape, generator=g) + 20
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _plain_reference_formula(q, k, v):
    """The authors' formula evaluated directly in the inputs' dtype (for the printed contrast)."""
    n, s = k.shape[2], q.shape[-1] ** -0.5
    kv = (k.transpose(-2, -1) * (s / n) ** 0.5) @ (v * (s / n) ** 0.5)
    return q @ kv + (1 - q @ k.mean(2, keepdim=True).transpose(-2, -1) * s) * v.mean(2, keepdim=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "kind,feature_map", [("inline", None), ("inline", "exp"), ("linear", None)], ids=["inline", "inline-exp", "linear"]
)
def test_autocast_large_inputs_finite_and_within_rounding(dtype, kind, feature_map):
    q, k, v = _large_inputs(dtype)
    if feature_map == "exp":  # exp(0.2 x) of |x| ~ 200 overflows even float32: use moderate keys
        q, k = (t.float().div(10).to(dtype) for t in (q, k))
    with torch.autocast("cpu", dtype=dtype):
        out = attention(q, k, v, kind=kind, feature_map=feature_map)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    ref = attention(q.double(), k.double(), v.double(), kind=kind, feature_map=feature_map)
    err = (out.double() - ref).abs()
    rounding = (ref.to(dtype).double() - ref).abs().max().item()
    if kind == "inline" and feature_map is None:
        plain = _plain_reference_formula(q, k, v).double()
        plain_err = (plain - ref).abs().max().item()
        print(f"plain low-precision formula: max err {plain_err:.3g}, finite={torch.isfinite(plain).all().item()}")
    print(f"{dtype}: max err {err.max().item():.4g}, mean {err.mean().item():.4g}, rounding {rounding:.4g}")
    assert err.max().item() <= 2 * rounding + 1e-6 * ref.abs().max().item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_inline_layer_autocast_no_nan_at_112x112(dtype):
    layer = build_attention("inline", 96, 3)
    x = 30 * torch.randn(1, N, 96) + 10
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        y = layer(x, (112, 112))
    assert torch.isfinite(y).all()
    with torch.no_grad():
        ref = layer.double()(x.double(), (112, 112))
    rel = ((y.double() - ref).norm() / ref.norm()).item()
    print(f"{dtype}: relative L2 error of the whole layer {rel:.3g}")
    # the layer's linears run in `dtype`: its relative error is that of a few roundings
    assert rel < 8 * torch.finfo(dtype).eps


# the Triton core's launches, each forced: (core kernels, split over token chunks, the kernels launched)
TRITON_LAUNCHES = {
    "triton-resident": ("resident", None, {"inline_fwd_resident", "inline_bwd_resident"}),
    "triton-stream": ("stream", None, {"inline_fwd_stream", "inline_bwd_stream"}),
    "triton-fused-launch": ("tiled", 1, {"inline_fwd_fused", "inline_bwd_fused"}),
    "triton-split-launch": (
        "tiled",
        4,
        {"inline_fwd_partial", "inline_fwd_rows", "inline_bwd_partial", "inline_bwd_rows"},
    ),
}


@pytest.mark.parametrize("impl", ["eager", "cpu", *TRITON_LAUNCHES])
def test_large_means_do_not_cancel_in_float32(impl, monkeypatch):
    # keys and values far from zero (1e3) with a unit spread, through the core's forward and
    # backward: each gradient as accurate as float32 allows (eager: ~3e-7), however far the means.
    # M = (K - k_bar)^T V / N must keep the spread's digits (dQ = G M^T exposes its error; centring
    # only K lost 77 % of M); dK = alpha Vc dM^T and dV = alpha Kc dM take the centred rows to sum
    # to zero, so every centred row must be exact to its own rounding (a float32 mean of K or V,
    # subtracted as one row, shifted them all alike: dK's error 1.5e-5 to 2.2e-4 here).
    import contextlib

    from inline_attn.ops import inline_tokens
    from inline_attn.ops.fused import triton as triton_core

    impl_arg, kernels, launches = impl, contextlib.nullcontext(), contextlib.nullcontext([])
    if impl in TRITON_LAUNCHES:
        core, split, _ = TRITON_LAUNCHES[impl]
        if split is not None:  # the launch plans cached so far did not ask _split
            monkeypatch.setattr(triton_core, "_split", lambda *a: split)
            monkeypatch.setattr(triton_core, "_plans", {})
        impl_arg, kernels, launches = "triton", triton_core.core_kernels(core), triton_core.record_launches()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 197, 64, generator=g) for _ in range(3))
    k, v = 1e3 + k, 1e3 + v
    kw = dict(num_heads=2, feat_size=(14, 14), num_prefix_tokens=1)
    ref_in = [t.double().requires_grad_() for t in (q, k, v)]
    ref = inline_tokens(*ref_in, impl="naive", **kw)
    grad = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    want = torch.autograd.grad(ref, ref_in, grad)
    got_in = [t.clone().requires_grad_() for t in (q, k, v)]
    with kernels, launches as log:
        got = torch.autograd.grad(inline_tokens(*got_in, impl=impl_arg, **kw), got_in, grad.float())
    if impl in TRITON_LAUNCHES:
        assert {launch.kernel for launch in log} == TRITON_LAUNCHES[impl][2]
    for name, a, b in zip(("dQ", "dK", "dV"), got, want):
        rel = ((a.double() - b).norm() / b.norm()).item()
        print(f"{impl}: {name} relative error {rel:.2e}")
        assert rel < 2e-6, name
