"""Random shapes, strides and dtypes through every implementation of the layer core, against naive.

The fused CPU kernel once read token strides below the channel span (expanded or overlapping
views) as BLAS leading dimensions and returned wrong numbers; every layout must now either be
read correctly (copied first where BLAS cannot read it) or refused with a clear error.
"""

from __future__ import annotations

import random

import pytest
import torch

from inline_attn.ops import inline_tokens

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
