"""The streaming Triton kernels of the InLine core (``core_kernels("stream")``; the launchers' default
is the resident kernels, tests/ops/test_triton.py) against float64.

Under Triton's interpreter (no CUDA here) in fp32, and with bf16 operands going into ``tl.dot`` as
on a GPU through the test-only shim of the interpreter's bf16 products (``interpreter_shim``).
Outputs and the gradients of q, k, v and the residual's taps on awkward shapes: batch 1, odd N
over several token tiles, H != W, prefix tokens, head dims 24 / 32 / 48 / 64, strided views of a
qkv projection and transposed buffers, keys and values offset far from their spread and at zero
mean (where their shifted values need more bits than bf16's). On a GPU the
same tests run natively (the shim is then not needed and not used).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from inline_attn.ops import inline_tokens
from inline_attn.ops.fused import triton as triton_core

from interpreter_shim import bf16_interpreter

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
OFFSET = 50.0  # keys and values this far from zero, their spread 1: the sums' cancellation is tested


@pytest.fixture(autouse=True)
def _streaming_kernels():
    with triton_core.core_kernels("stream"):
        yield


def _bf16_path():
    return bf16_interpreter() if DEVICE == "cpu" else contextlib.nullcontext()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _inputs(shape, dtype, layout, offsets=(OFFSET, OFFSET)):
    """q, k, v as views of one [B, N, 3C] projection ("fused") or of a transposed [B, 3C, N] buffer
    (token stride 1), k and v offset by ``offsets``; the residual's taps [B, C, 3, 3]."""
    b, h, w, heads, d, p = shape
    n, c = p + h * w, heads * d
    shift = torch.tensor([0.0] * c + [offsets[0]] * c + [offsets[1]] * c, dtype=torch.float64, device=DEVICE)
    if layout == "fused":
        base = torch.randn(b, n, 3 * c, dtype=torch.float64, device=DEVICE) + shift
        q, k, v = base.to(dtype).requires_grad_().chunk(3, dim=-1)
    else:
        base = torch.randn(b, 3 * c, n, dtype=torch.float64, device=DEVICE) + shift[:, None]
        q, k, v = base.to(dtype).requires_grad_().transpose(1, 2).chunk(3, dim=-1)
    taps = (0.5 * torch.randn(b, c, 3, 3, dtype=torch.float64, device=DEVICE)).to(dtype).requires_grad_()
    return q, k, v, taps


def _errors(shape, dtype, layout, impl="triton", offsets=(OFFSET, OFFSET), residual=True):
    """Relative errors of (out, dq, dk, dv[, dtaps]) against float64 on the same rounded inputs, and
    the Triton launches."""
    b, h, w, heads, d, p = shape
    q, k, v, taps = _inputs(shape, dtype, layout, offsets)
    inputs = (q, k, v, taps) if residual else (q, k, v)
    kw = dict(num_heads=heads, feat_size=(h, w), num_prefix_tokens=p)
    doubles = [t.detach().double().requires_grad_() for t in inputs]
    ref = inline_tokens(*doubles[:3], residual_weights=doubles[3] if residual else None, impl="naive", **kw)
    g = torch.randn_like(ref)
    want = torch.autograd.grad(ref, doubles, g)
    with triton_core.record_launches() as log:
        out = inline_tokens(q, k, v, residual_weights=taps if residual else None, impl=impl, **kw)
        got = torch.autograd.grad(out, inputs, g.to(dtype))
    assert out.dtype == dtype
    return [_rel(out, ref)] + [_rel(a, r) for a, r in zip(got, want)], [x.kernel for x in log]


# (B, H, W, heads, head_dim, prefix)
FP32_SHAPES = [(1, 5, 7, 2, 24, 1), (2, 3, 2, 1, 32, 0)]


@pytest.mark.parametrize("layout", ["fused", "transposed"])
@pytest.mark.parametrize("shape", FP32_SHAPES, ids=str)
def test_stream_float32_matches_float64(shape, layout):
    errs, kernels = _errors(shape, torch.float32, layout)
    assert kernels == ["inline_fwd_stream", "inline_bwd_stream"], kernels
    assert errs[0] < 2e-6, errs
    assert max(errs[1:]) < 1e-5, errs


# bf16 through the shim: 36 tokens (several tiles), head dims 24 / 48 / 64 (tiles padded to 32 / 64)
BF16_SHAPES = [(1, 5, 7, 2, 24, 1), (1, 3, 3, 1, 48, 0), (2, 4, 3, 1, 64, 2)]


# (k offset, v offset): both far from zero (their shifted values exact in bf16), both at zero mean,
# and keys far from zero beside zero-mean values (the shifted values' low halves times the keys'
# mean: what the sums' split operands are for)
OFFSETS = {"offset": (OFFSET, OFFSET), "zero_mean": (0.0, 0.0), "keys_offset": (OFFSET, 0.0)}


@pytest.mark.parametrize("offsets", list(OFFSETS))
@pytest.mark.parametrize("shape", BF16_SHAPES, ids=str)
def test_stream_bf16_operands_within_twice_eager(shape, offsets):
    # flash-attention's rule: against float64 on the same rounded inputs, the kernels' error stays
    # within ~2x that of the eager path in bf16 (float32 sums inside)
    with _bf16_path():
        errs, kernels = _errors(shape, torch.bfloat16, "fused", offsets=OFFSETS[offsets])
    eager, _ = _errors(shape, torch.bfloat16, "fused", impl="eager", offsets=OFFSETS[offsets])
    assert kernels == ["inline_fwd_stream", "inline_bwd_stream"], kernels
    for name, et, ee in zip(("out", "dq", "dk", "dv", "dw"), errs, eager):
        assert et <= 2 * ee + 1e-3, (name, et, ee)  # 1e-3: below bf16's rounding of one value


# zero-mean keys and values (the common case): centred on token 0 they need more bits than bf16's 8,
# where OFFSET's (0.25 apart near 50) are exact in bf16; without the residual, out = Q M + v_bar
# shows the sums' error as dQ = G M^T does (DeiT's 197 tokens: 7 row tiles; the sums' error grows
# with the tokens)
@pytest.mark.parametrize("residual", [True, False], ids=["res", "nores"])
def test_stream_bf16_zero_mean_within_twice_eager(residual):
    shape = (1, 14, 14, 1, 32, 1)
    with _bf16_path():
        errs, kernels = _errors(shape, torch.bfloat16, "fused", offsets=(0.0, 0.0), residual=residual)
    eager, _ = _errors(shape, torch.bfloat16, "fused", impl="eager", offsets=(0.0, 0.0), residual=residual)
    print(f"triton {errs}, eager {eager}")
    assert kernels == ["inline_fwd_stream", "inline_bwd_stream"], kernels
    for name, et, ee in zip(("out", "dq", "dk", "dv", "dw"), errs, eager):
        assert et <= 2 * ee + 1e-3, (name, et, ee)  # 1e-3: below bf16's rounding of one value


def test_stream_backward_is_bit_reproducible():
    shape = (1, 5, 7, 2, 24, 1)
    b, h, w, heads, d, p = shape
    q, k, v, taps = _inputs(shape, torch.bfloat16, "fused")
    kw = dict(num_heads=heads, feat_size=(h, w), num_prefix_tokens=p, residual_weights=taps)
    g = torch.randn(b, p + h * w, heads * d, device=DEVICE, dtype=torch.bfloat16)
    with _bf16_path():
        first = torch.autograd.grad(inline_tokens(q, k, v, impl="triton", **kw), (q, k, v, taps), g)
        second = torch.autograd.grad(inline_tokens(q, k, v, impl="triton", **kw), (q, k, v, taps), g)
    for a, b_ in zip(first, second):
        assert torch.equal(a, b_)


def test_the_shim_makes_the_interpreters_bf16_product_right():
    if DEVICE == "cuda":
        pytest.skip("the shim stands in for the GPU's products: nothing to check on a GPU")
    import triton
    import triton.language as tl

    @triton.jit
    def dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        a = tl.load(a_ptr + i[:, None] * N + i[None, :])
        b = tl.load(b_ptr + i[:, None] * N + i[None, :]).to(tl.float32).to(tl.bfloat16)
        tl.store(c_ptr + i[:, None] * N + i[None, :], tl.dot(a, b))

    a, b = torch.randn(16, 16).bfloat16(), torch.randn(16, 16).bfloat16()
    c = torch.empty(16, 16)
    with bf16_interpreter():
        dot_kernel[(1,)](a, b, c, N=16)
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["tf32", "ieee"])
def test_the_shim_reads_fp32_operands_of_tf32_products_as_tf32(precision):
    # a GPU's tf32 product reads the top 10 mantissa bits of its fp32 operands (unrounded: Triton
    # passes the registers as they are); an "ieee" product keeps all 23
    if DEVICE == "cuda":
        pytest.skip("the shim stands in for the GPU's products: nothing to check on a GPU")
    import triton
    import triton.language as tl

    @triton.jit
    def dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr, PREC: tl.constexpr):
        i = tl.arange(0, N)
        a = tl.load(a_ptr + i[:, None] * N + i[None, :])
        b = tl.load(b_ptr + i[:, None] * N + i[None, :])
        tl.store(c_ptr + i[:, None] * N + i[None, :], tl.dot(a, b, input_precision=PREC))

    def tf32(x):
        return (x.view(torch.int32) & ~0x1FFF).view(torch.float32)

    a, b = torch.randn(16, 16), torch.randn(16, 16)
    c = torch.empty(16, 16)
    with bf16_interpreter():
        dot_kernel[(1,)](a, b, c, N=16, PREC=precision)
    exact, truncated = a.double() @ b.double(), tf32(a).double() @ tf32(b).double()
    assert not torch.allclose(exact, truncated, rtol=1e-5, atol=1e-5)  # the check tells them apart
    torch.testing.assert_close(c.double(), truncated if precision == "tf32" else exact, rtol=1e-6, atol=1e-6)


def test_core_kernels_switch_selects_the_kernels_inside_its_block_only():
    # gpu-check times the default kernels and the streaming ones side by side with this switch
    q, k, v = torch.randn(2, 16, 3 * 32, device=DEVICE).chunk(3, dim=-1)
    kw = dict(num_heads=2, feat_size=(4, 4), impl="triton")
    with triton_core.record_launches() as log:
        with triton_core.core_kernels("resident"):
            old = inline_tokens(q, k, v, **kw)
        with triton_core.core_kernels("tiled"):
            tiled = inline_tokens(q, k, v, **kw)
        new = inline_tokens(q, k, v, **kw)
    assert [x.kernel for x in log] == ["inline_fwd_resident", "inline_fwd_fused", "inline_fwd_stream"]
    torch.testing.assert_close(old, new, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(tiled, new, rtol=2e-6, atol=1e-6)
    with pytest.raises(ValueError, match="core kernels 'fast'"):
        with triton_core.core_kernels("fast"):
            pass
