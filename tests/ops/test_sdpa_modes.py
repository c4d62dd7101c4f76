"""The SDPA-shaped ops (inline_attention, linear_attention, softmax through attention()) in every mode
against the float64 explicit-weights reference: key-padding masks, cross-attention, causal order,
the recurrent step, bf16 autocast; outputs and gradients."""

from __future__ import annotations

import pytest
import torch

from inline_attn.ops import (
    InLineState,
    attention,
    attention_weights,
    inline_attention,
    inline_attention_step,
    inline_state,
    linear_attention,
    why_not_fused,
)
from inline_attn.ops.causal import causal_inline

KINDS = [("inline", "identity"), ("inline", "relu"), ("linear", "exp"), ("softmax", None)]


def _qkv(b, h, nq, nk, d, dv=None, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    shapes = ((b, h, nq, d), (b, h, nk, d), (b, h, nk, dv or d))
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_() for s in shapes]


def _masks(b, n):
    """All valid, ragged (lengths n, n-2, 1: one valid token), and a fully masked sample."""
    lengths = [n, max(n - 2, 1), 1][:b]
    ragged = torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]
    empty = ragged.clone()
    empty[-1] = True
    return {"none": None, "all-valid": torch.zeros(b, n, dtype=torch.bool), "ragged": ragged, "one-empty": empty}


def _check(kind, phi, q, k, v, **mode):
    kw = dict(kind=kind) if phi is None else dict(kind=kind, feature_map=phi)
    fast = attention(q, k, v, **kw, **mode)
    ref = attention(q, k, v, impl="naive", **kw, **mode)
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(ref)
    got = torch.autograd.grad(fast, (q, k, v), g)
    want = torch.autograd.grad(ref, (q, k, v), g)
    for a, w in zip(got, want, strict=True):
        torch.testing.assert_close(a, w, rtol=1e-9, atol=1e-9)
    return fast


@pytest.mark.parametrize("kind,phi", KINDS, ids=[f"{k}-{p}" for k, p in KINDS])
@pytest.mark.parametrize("mask", ["none", "all-valid", "ragged", "one-empty"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_modes_match_reference(kind, phi, mask, causal):
    q, k, v = _qkv(3, 2, 7, 7, 5, dv=3)
    out = _check(kind, phi, q, k, v, key_padding_mask=_masks(3, 7)[mask], is_causal=causal)
    if mask == "one-empty":  # a sample with no valid key: defined as zeros
        assert out[-1].abs().max() == 0


@pytest.mark.parametrize("kind,phi", KINDS, ids=[f"{k}-{p}" for k, p in KINDS])
@pytest.mark.parametrize("nq,nk", [(1, 9), (5, 2), (11, 4)])
def test_cross_attention_with_ragged_keys(kind, phi, nq, nk):
    q, k, v = _qkv(3, 2, nq, nk, 4, dv=6, seed=1)
    _check(kind, phi, q, k, v)
    _check(kind, phi, q, k, v, key_padding_mask=_masks(3, nk)["ragged"])


@pytest.mark.parametrize("n", [1, 2, 7, 63, 64, 65, 130])
def test_causal_inline_across_chunks(n):
    """Causal InLine at N = 1, 2, odd N and across the 64-token chunk boundaries."""
    q, k, v = _qkv(2, 2, n, n, 6, seed=n)
    _check("inline", "identity", q, k, v, is_causal=True)


def test_causal_chunk_size_does_not_change_the_result():
    q, k, v = (t.detach() for t in _qkv(1, 2, 50, 50, 4, seed=3))
    outs = [causal_inline(q, k, v, None, 0.5, chunk=c) for c in (1, 7, 16, 64)]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-12, atol=1e-12)


def test_causal_weights_are_the_written_form_and_the_last_row_is_the_bidirectional_op():
    """``w_ij = (1 + s q_i.(k_j - mean_{m<=i} k_m)) / i`` for j <= i, written out for two rows."""
    q, k, v = (t.detach() for t in _qkv(1, 1, 5, 5, 3, seed=4))
    w = attention_weights(q, k, kind="inline", is_causal=True, scale=0.7)[0, 0]
    for i in (0, 3):
        mean = k[0, 0, : i + 1].mean(dim=0)
        want = (1 + 0.7 * (k[0, 0, : i + 1] - mean) @ q[0, 0, i]) / (i + 1)
        torch.testing.assert_close(w[i, : i + 1], want)
        assert w[i, i + 1 :].abs().max() == 0 if i < 4 else True
    torch.testing.assert_close(w.sum(-1), torch.ones(5, dtype=w.dtype))
    full = inline_attention(q, k, v, scale=0.7)
    causal = inline_attention(q, k, v, scale=0.7, is_causal=True)
    torch.testing.assert_close(causal[:, :, -1], full[:, :, -1])


@pytest.mark.parametrize("phi", ["identity", "relu"])
def test_recurrent_steps_equal_the_full_pass(phi):
    q, k, v = (t.detach() for t in _qkv(3, 2, 70, 70, 4, dv=5, seed=5))
    pad = _masks(3, 70)["one-empty"]
    pad[0, 10:13] = True  # padding in the middle too
    full = inline_attention(q, k, v, is_causal=True, key_padding_mask=pad, feature_map=phi)
    state, outs = None, []
    for i in range(70):
        one = slice(i, i + 1)
        out, state = inline_attention_step(
            q[:, :, one], k[:, :, one], v[:, :, one], state, key_padding_mask=pad[:, one], feature_map=phi
        )
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=1e-10, atol=1e-10)
    # a prefill of the first 40 tokens, then steps
    state = inline_state(k[:, :, :40], v[:, :, :40], key_padding_mask=pad[:, :40], feature_map=phi)
    assert isinstance(state, InLineState) and state.comoment.shape == (3, 2, 4, 5)
    one = slice(40, 41)
    out, _ = inline_attention_step(
        q[:, :, one], k[:, :, one], v[:, :, one], state, key_padding_mask=pad[:, one], feature_map=phi
    )
    torch.testing.assert_close(out, full[:, :, 40:41], rtol=1e-10, atol=1e-10)


def test_recurrent_step_gradients_match_the_full_pass():
    q, k, v = _qkv(1, 1, 6, 6, 3, seed=6)
    state, outs = None, []
    for i in range(6):
        out, state = inline_attention_step(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], state)
        outs.append(out)
    stepped = torch.cat(outs, dim=2)
    g = torch.randn_like(stepped)
    got = torch.autograd.grad(stepped, (q, k, v), g)
    want = torch.autograd.grad(attention(q, k, v, impl="naive", is_causal=True), (q, k, v), g)
    for a, w in zip(got, want, strict=True):
        torch.testing.assert_close(a, w, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fn", [inline_attention, linear_attention])
def test_bf16_autocast_sums_in_float32(fn, causal):
    q, k, v = (t.detach().float() for t in _qkv(2, 2, 130, 130, 8, seed=7))
    pad = _masks(2, 130)["ragged"]
    phi = {} if fn is inline_attention else {"feature_map": "exp"}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fn(q, k, v, key_padding_mask=pad, is_causal=causal, **phi)
    assert out.dtype == torch.bfloat16
    kind = "inline" if fn is inline_attention else "linear"
    ref = attention(
        q.double(), k.double(), v.double(), kind=kind, impl="naive", key_padding_mask=pad, is_causal=causal, **phi
    )
    assert (out.double() - ref).abs().max() / (ref.abs().max() + 1) < 2e-2


def test_why_not_fused_names_the_mode():
    q, k, _ = (t.detach() for t in _qkv(2, 2, 8, 5, 4))
    assert "key_padding_mask" in why_not_fused(q, key_padding_mask=torch.zeros(2, 8, dtype=torch.bool))
    assert "is_causal" in why_not_fused(q, is_causal=True)
    assert "cross-attention" in why_not_fused(q, k=k)
    assert "impl='eager'" in why_not_fused(q, impl="eager")
    with pytest.raises(ValueError, match="is_causal"):
        inline_attention(q, q, q, is_causal=True, impl="cpu")


def test_plain_self_attention_takes_the_fused_op_where_it_runs():
    q, k, v = _qkv(2, 3, 17, 17, 8, seed=8)
    reason = why_not_fused(q.detach())
    out = inline_attention(q, k, v)
    _check("inline", "identity", q, k, v)
    if reason is None:  # the C++ kernel built: its output and gradient against the reference too
        ref = attention(q, k, v, impl="naive")
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    else:
        assert "C++" in reason or "torch.func" in reason


def test_bad_modes_are_refused_with_the_value():
    q, k, v = (t.detach() for t in _qkv(2, 1, 4, 6, 3))
    with pytest.raises(ValueError, match=r"Nq=4 and Nk=6"):
        inline_attention(q, k, v, is_causal=True)
    with pytest.raises(ValueError, match=r"\[B, Nk\] = \(2, 6\)"):
        inline_attention(q, k, v, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool tensor"):
        linear_attention(q, k, v, key_padding_mask=torch.zeros(2, 6))
    with pytest.raises(ValueError, match="one token"):
        inline_attention_step(q, k, v)


def test_a_step_refuses_a_state_of_other_sizes_dtype_or_type():
    # a state of another batch or head count broadcast against the token (B=1 gave a [2, 3, 1, 5] output)
    q, k, v = (t.detach() for t in _qkv(2, 3, 6, 6, 8, dv=5, seed=9))
    state = inline_state(k[:, :, :5], v[:, :, :5])
    new = slice(5, 6)
    held = r"state is for B=2, H=3, D=8, Dv=5, torch.float64 on cpu; got q/k/v for "
    cases = [
        ((q[:1], k[:1], v[:1]), r"B=1, H=3, D=8, Dv=5, torch.float64 on cpu \(q of shape \(1, 3, 1, 8\)"),
        ((q[:, :1], k[:, :1], v[:, :1]), r"B=2, H=1, D=8, Dv=5"),
        ((q[..., :4], k[..., :4], v), r"B=2, H=3, D=4, Dv=5"),
        ((q, k, v[..., :2]), r"B=2, H=3, D=8, Dv=2"),
        ((q.float(), k.float(), v.float()), r"B=2, H=3, D=8, Dv=5, torch.float32 on cpu"),
    ]
    for (qs, ks, vs), got in cases:
        with pytest.raises(ValueError, match=held + got):
            inline_attention_step(qs[:, :, new], ks[:, :, new], vs[:, :, new], state)
    small = inline_state(k[:1, :1, :5], v[:1, :1, :5])  # the other direction: a smaller state
    with pytest.raises(ValueError, match=r"state is for B=1, H=1, D=8, Dv=5, .* got q/k/v for B=2, H=3"):
        inline_attention_step(q[:, :, new], k[:, :, new], v[:, :, new], small)
    with pytest.raises(ValueError, match=r"state must be an InLineState .*, got dict"):
        inline_attention_step(q[:, :, new], k[:, :, new], v[:, :, new], {})
    # a low-precision token goes on from its float32 state (the compute dtype), and matches the full pass
    low = [t.to(torch.bfloat16) for t in (q, k, v)]
    out, _ = inline_attention_step(*(t[:, :, new] for t in low), inline_state(low[1][:, :, :5], low[2][:, :, :5]))
    full = inline_attention(*(t.float() for t in low), is_causal=True)[:, :, new]
    torch.testing.assert_close(out.float(), full, rtol=1e-2, atol=1e-2)


EMPTY_PATHS = [(impl, {}) for impl in (None, "eager", "naive", "cpu")] + [
    (impl, {"is_causal": True})
    for impl in (None, "eager", "naive")  # impl="cpu" refuses causal order
]


@pytest.mark.parametrize(
    "impl,mode", EMPTY_PATHS, ids=[f"{i}-{'causal' if m else 'bidirectional'}" for i, m in EMPTY_PATHS]
)
@pytest.mark.parametrize("shape", [(0, 4, 10, 16), (2, 0, 10, 16)], ids=["no-samples", "no-heads"])
def test_no_samples_or_no_heads_give_an_empty_output_and_gradients(shape, impl, mode):
    # B or H = 0 failed in a reshape that inferred Dv from no elements (the fused path, causal order)
    q, k, v = (torch.randn(shape, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = inline_attention(q, k, v, impl=impl, **mode)
    assert out.shape == shape
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert [g.shape for g in grads] == [torch.Size(shape)] * 3
