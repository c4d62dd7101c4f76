"""Random shapes, strides and dtypes through every public op, fast paths against the naive reference:
the layer core (inline_tokens, every implementation), the attention cores (attention and the eager
inline / linear / softmax functions, outputs and gradients) and the local residual (local_residual,
grid_residual); bad inputs give clear errors.

The fused CPU kernel once read token strides below the channel span (expanded or overlapping
views) as BLAS leading dimensions and returned wrong numbers; every layout must now either be
read correctly (copied first where BLAS cannot read it) or refused with a clear error.
"""

from __future__ import annotations

import random

import pytest
import torch

from inline_attn.ops import (
    attention,
    grid_residual,
    inline_attention,
    inline_tokens,
    linear_attention,
    local_residual,
    naive_local_residual,
    softmax_attention,
)

IMPLS = ["auto", "eager", "cpu", "triton"]


def test_expanded_query_regression():
    # repro: a zero token stride (one token repeated) gave errors of 0.7-1.5 and a BLAS complaint
    q = torch.randn(2, 1, 12).expand(2, 16, 12)
    k, v = torch.randn(2, 16, 12), torch.randn(2, 16, 12)
    kw = dict(num_heads=2, feat_size=(4, 4))
    ref = inline_tokens(q.double(), k.double(), v.double(), impl="naive", **kw)
    for impl in IMPLS:
        torch.testing.assert_close(inline_tokens(q, k, v, impl=impl, **kw).double(), ref, rtol=1e-5, atol=1e-5)


def test_overlapping_token_stride_regression():
    # repro: as_strided with token stride 2 (rows overlap: C = 12)
    base = torch.randn(2 * 64 + 40)
    q = base.as_strided((2, 16, 12), (64, 2, 1))
    k = base.as_strided((2, 16, 12), (64, 3, 1), storage_offset=5)
    v = base.as_strided((2, 16, 12), (64, 1, 1), storage_offset=9)
    kw = dict(num_heads=3, feat_size=(4, 4), residual_weights=torch.randn(2, 12, 3, 3))
    ref = inline_tokens(
        q.double(), k.double(), v.double(), impl="naive", **{**kw, "residual_weights": kw["residual_weights"].double()}
    )
    for impl in IMPLS:
        torch.testing.assert_close(inline_tokens(q, k, v, impl=impl, **kw).double(), ref, rtol=1e-5, atol=1e-5)


def _random_view(rng: random.Random, b: int, n: int, c: int, dtype: torch.dtype) -> torch.Tensor:
    """A [b, n, c] view with random batch / token / channel strides (possibly 0, overlapping,
    transposed or padded) into a fresh buffer."""
    kind = rng.choice(["contiguous", "padded", "overlap", "zero-token", "transposed", "zero-batch"])
    if kind == "contiguous":
        return torch.randn(b, n, c, dtype=dtype)
    if kind == "transposed":
        return torch.randn(b, c, n, dtype=dtype).transpose(1, 2)
    sc = 1
    sn = {"padded": c + rng.randint(1, 5), "overlap": rng.randint(1, max(1, c - 1)), "zero-token": 0}.get(kind, c)
    sb = 0 if kind == "zero-batch" else sn * n + rng.randint(0, 7)
    size = 1 + (b - 1) * sb + (n - 1) * sn + (c - 1) * sc + rng.randint(0, 3)
    offset = rng.randint(0, 3)
    return torch.randn(size + offset, dtype=dtype).as_strided((b, n, c), (sb, sn, sc), storage_offset=offset)


@pytest.mark.parametrize("seed", range(40))
def test_fuzz_layouts_every_impl(seed):
    rng = random.Random(seed)
    heads = rng.choice([1, 2, 3])
    d = rng.choice([2, 4, 8, 16])
    c = heads * d
    h, w, p = rng.randint(1, 5), rng.randint(1, 5), rng.choice([0, 0, 1, 2])
    b, n = rng.randint(1, 3), p + h * w
    dtype = rng.choice([torch.float32, torch.float32, torch.bfloat16, torch.float64])
    q, k, v = (_random_view(rng, b, n, c, dtype) for _ in range(3))
    taps = torch.randn(b, c, 3, 3, dtype=dtype) if rng.random() < 0.7 else None
    kw = dict(num_heads=heads, feat_size=(h, w), num_prefix_tokens=p)
    exact = dict(residual_weights=taps.double() if taps is not None else None)
    ref = inline_tokens(q.double(), k.double(), v.double(), impl="naive", **kw, **exact)
    tol = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 4e-2}[dtype]
    for impl in IMPLS:
        if impl == "triton" and dtype == torch.float64:
            with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
                inline_tokens(q, k, v, impl=impl, residual_weights=taps, **kw)
            continue
        out = inline_tokens(q, k, v, impl=impl, residual_weights=taps, **kw)
        assert out.dtype == dtype and out.shape == (b, n, c)
        scale = ref.abs().max().item() + 1.0
        err = (out.double() - ref).abs().max().item() / scale
        assert err < tol, f"impl={impl} dtype={dtype} strides={q.stride()},{k.stride()},{v.stride()}: {err:.2e}"


# ---- the [B, H, N, D] attention cores and the local residual: random shapes, layouts and dtypes

FLOAT_TOL = {torch.float64: 1e-10, torch.float32: 5e-5, torch.bfloat16: 5e-2, torch.float16: 1e-2}


def _random_layout(rng: random.Random, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``shape`` in a random memory layout: contiguous, permuted, strided slice of a
    larger buffer, expanded (stride 0) along a size-1-able dimension, or with a storage offset."""
    kind = rng.choice(["contiguous", "permuted", "sliced", "expanded", "offset"])
    if kind == "permuted":
        perm = list(range(len(shape)))
        rng.shuffle(perm)
        base = torch.randn([shape[p] for p in perm], dtype=dtype)
        return base.permute([perm.index(i) for i in range(len(shape))])
    if kind == "sliced":
        dim = rng.randrange(len(shape))
        big = list(shape)
        big[dim] = 2 * shape[dim] + 1
        return (
            torch.randn(big, dtype=dtype)
            .narrow(dim, 1, 2 * shape[dim])
            .unflatten(dim, (shape[dim], 2))
            .select(dim + 1, 0)
        )
    if kind == "expanded":
        dim = rng.randrange(len(shape))
        one = list(shape)
        one[dim] = 1
        return torch.randn(one, dtype=dtype).expand(shape)
    if kind == "offset":
        numel = 1
        for s in shape:
            numel *= s
        return torch.randn(numel + 3, dtype=dtype)[3:].view(shape)
    return torch.randn(shape, dtype=dtype)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if ref.numel() == 0:
        return 0.0
    return (out.double() - ref).abs().max().item() / (ref.abs().max().item() + 1.0)


@pytest.mark.parametrize("seed", range(60))
def test_fuzz_attention_cores_against_naive(seed):
    """attention(kind, impl="auto") and the eager functions against the explicit-weights reference,
    outputs and (float64) gradients."""
    rng = random.Random(1000 + seed)
    kind = rng.choice(["inline", "linear", "softmax"])
    dtype = rng.choice([torch.float32, torch.float32, torch.float64, torch.bfloat16, torch.float16])
    b, h, nq, n, d, dv = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 9), rng.randint(1, 9), 0, 0
    d, dv = rng.choice([1, 2, 4, 8, 16]), rng.choice([1, 3, 8])
    if kind == "inline":
        nq = n  # the InLine weights are defined for N queries over the same N tokens
    q, k = _random_layout(rng, (b, h, nq, d), dtype), _random_layout(rng, (b, h, n, d), dtype)
    v = _random_layout(rng, (b, h, n, dv), dtype)
    # linear attention divides by phi(q).sum phi(k): exp keeps it away from zero (relu can make it ~0)
    phi = {"inline": rng.choice(["identity", "relu", "leakyrelu", "exp"]), "linear": "exp", "softmax": None}[kind]
    kw = dict(kind=kind, feature_map=phi) if phi else dict(kind=kind)
    if kind != "linear" and rng.random() < 0.5:
        kw["scale"] = rng.choice([0.1, 0.5, 2.0])
    if kind == "softmax" and rng.random() < 0.5:
        mask = torch.rand(b, 1, nq, n) < 0.7
        mask[..., 0] = True  # every query keeps a key (an all-masked row has no defined softmax)
        kw["mask"] = mask
    ref = attention(q.double(), k.double(), v.double(), impl="naive", **kw)
    fast = {"inline": inline_attention, "linear": linear_attention, "softmax": softmax_attention}[kind]
    direct = {key: val for key, val in kw.items() if key != "kind"}
    for out in (attention(q, k, v, impl="auto", **kw), fast(q, k, v, **direct)):
        assert out.dtype == dtype and out.shape == (b, h, nq, dv)
        err = _rel_err(out, ref)
        assert err < FLOAT_TOL[dtype], f"{kind} {dtype} q{q.stride()} k{k.stride()} v{v.stride()}: {err:.2e}"
    if dtype == torch.float64:  # gradients, exact arithmetic: the eager path against the reference
        qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
        g = torch.randn(b, h, nq, dv, dtype=dtype)
        got = torch.autograd.grad(attention(qg, kg, vg, impl="auto", **kw), (qg, kg, vg), g)
        want = torch.autograd.grad(attention(qg, kg, vg, impl="naive", **kw), (qg, kg, vg), g)
        for a, w in zip(got, want, strict=True):
            assert _rel_err(a, w) < 1e-9


@pytest.mark.parametrize("seed", range(30))
def test_fuzz_local_residual_against_naive(seed):
    """local_residual (grouped convolution) and grid_residual against the nine shifted multiply-adds."""
    rng = random.Random(2000 + seed)
    dtype = rng.choice([torch.float32, torch.float64, torch.bfloat16])
    b, c, hh, ww, p = rng.randint(0, 3), rng.randint(1, 6), rng.randint(1, 6), rng.randint(1, 6), rng.choice([0, 1])
    v_img = _random_layout(rng, (b, c, hh, ww), dtype)
    weights = _random_layout(rng, (b, c, 3, 3), dtype)
    ref = naive_local_residual(v_img.double(), weights.double())
    out = local_residual(v_img, weights)
    assert out.dtype == dtype and out.shape == (b, c, hh, ww)
    assert _rel_err(out, ref) < FLOAT_TOL[dtype]
    tokens = _random_layout(rng, (b, p + hh * ww, c), dtype)
    grid = tokens[:, p:].reshape(b, hh, ww, c).permute(0, 3, 1, 2)
    want = naive_local_residual(grid.double(), weights.double()).flatten(2).transpose(1, 2)
    for impl in ("eager", "naive"):
        got = grid_residual(tokens, weights, (hh, ww), p, impl=impl)
        assert got.shape == (b, hh * ww, c) and _rel_err(got, want) < FLOAT_TOL[dtype]
    if dtype == torch.float64 and b > 0:
        vg, wg = v_img.detach().clone().requires_grad_(), weights.detach().clone().requires_grad_()
        g = torch.randn(b, c, hh, ww, dtype=dtype)
        got = torch.autograd.grad(local_residual(vg, wg), (vg, wg), g)
        want = torch.autograd.grad(naive_local_residual(vg, wg), (vg, wg), g)
        for a, w in zip(got, want, strict=True):
            assert _rel_err(a, w) < 1e-10


def _bad_inputs():
    x = torch.randn(1, 2, 4, 8)
    return [
        ("int64", (x.long(), x, x), "q must have a floating-point dtype, got torch.int64"),
        ("mixed dtypes", (x, x.double(), x), "share one dtype, got q torch.float32 and k torch.float64"),
        ("meta and cpu", (x, x.to("meta"), x), "on one device, got q on cpu and k on meta"),
        ("a list", (x.tolist(), x, x), "q must be a torch.Tensor, got list"),
        ("rank 3", (x[0], x[0], x[0]), r"q must have rank 4 \[batch, heads, tokens, head_dim\]"),
        ("no keys", (x, x[:, :, :0], x[:, :, :0]), "k has no tokens"),
        ("head_dim mismatch", (x, x[..., :4], x), "must agree in batch, heads and head_dim"),
        ("head_dim 0", (x[..., :0], x[..., :0], x), "head_dim 0 .*expected head_dim >= 1"),
    ]


@pytest.mark.parametrize("kind", ["inline", "linear", "softmax"])
@pytest.mark.parametrize("impl", ["auto", "naive"])
@pytest.mark.parametrize("case", _bad_inputs(), ids=lambda c: c[0])
def test_attention_bad_inputs_are_clear_errors(kind, impl, case):
    _, (q, k, v), match = case
    with pytest.raises(ValueError, match=match):
        attention(q, k, v, kind=kind, impl=impl)


@pytest.mark.parametrize("fn", [local_residual, naive_local_residual])
def test_local_residual_bad_inputs_are_clear_errors(fn):
    v, w = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 3, 3)
    with pytest.raises(ValueError, match="v must have a floating-point dtype, got torch.int64"):
        fn(v.long(), w)
    with pytest.raises(ValueError, match=r"weights must have shape \(2, 3, 3, 3\), got \(2, 3, 9\)"):
        fn(v, w.flatten(2))
    with pytest.raises(ValueError, match="share one dtype and device, got v torch.float32 on cpu and weights "):
        fn(v, w.double())
    with pytest.raises(ValueError, match=r"v must be \[B, C, H, W\], got shape \(3, 4, 4\)"):
        fn(v[0], w)
    with pytest.raises(ValueError, match="weights must be a torch.Tensor, got list"):
        fn(v, w.tolist())
    with pytest.raises(ValueError, match=r"token count N=16 does not match num_prefix_tokens \+ H\*W = 1 \+ 4\*4"):
        grid_residual(v.flatten(2).transpose(1, 2), w, (4, 4), 1)
