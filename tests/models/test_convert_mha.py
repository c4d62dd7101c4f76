"""The converted nn.MultiheadAttention against hand computations: padded tokens feed neither the local
residual's context nor its 3x3 convolution, the residual only in self-attention, torch's unbatched
form; and the refusals of convert's arguments and of the converted module's inputs, by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import inline_attn
from inline_attn.ops import attention

E, HEADS = 8, 2


def _converted_mha(batch_first=True, num_prefix_tokens=0, **mha_args) -> nn.Module:
    """A float64 MultiheadAttention converted with the residual on a square grid after
    ``num_prefix_tokens``, its predictor given non-zero weights (convert starts it at zero)."""
    torch.manual_seed(0)
    parent = nn.Module()
    parent.mha = nn.MultiheadAttention(E, HEADS, batch_first=batch_first, **mha_args).double()
    inline_attn.convert(parent, num_prefix_tokens=num_prefix_tokens)
    with torch.no_grad():
        for p in parent.mha.residual.parameters():
            p.normal_()
    return parent.mha


def _heads(mha, query, key, value):
    """Batch-first [B, L, E] inputs -> q, k, v: [B, h, L, d] by the module's own projections."""
    weights, biases = mha.in_proj_weight.chunk(3), mha.in_proj_bias.chunk(3)
    return [
        (t @ w.T + b).unflatten(-1, (HEADS, E // HEADS)).transpose(1, 2)
        for t, w, b in zip((query, key, value), weights, biases, strict=True)
    ]


def _reference(mha, query, key, value, pad=None, residual=False, prefix=0):
    """The converted module's output by hand (batch first): the naive InLine weights, plus, with
    ``residual``, the 3x3 convolution of V with padded tokens zeroed, its kernels predicted from
    the mean of the valid query tokens."""
    q, k, v = _heads(mha, query, key, value)
    out = attention(q, k, v, impl="naive", key_padding_mask=pad).transpose(1, 2).flatten(2)
    if residual:
        b, n, _ = query.shape
        valid = torch.ones(b, n, dtype=torch.bool) if pad is None else ~pad
        context = torch.stack([query[i][valid[i]].mean(dim=0) for i in range(b)])
        kernels = mha.residual.predict(context)  # [B, E, 3, 3]
        side = int((n - prefix) ** 0.5)
        v_tokens = (v.transpose(1, 2).flatten(2) * valid[..., None])[:, prefix:]
        v_img = v_tokens.transpose(1, 2).reshape(1, b * E, side, side)
        res = F.conv2d(v_img, kernels.reshape(b * E, 1, 3, 3), padding=1, groups=b * E)
        out = out.clone()
        out[:, prefix:] += res.reshape(b, E, side * side).transpose(1, 2)
    return mha.out_proj(out)


@pytest.mark.parametrize("batch_first", [True, False])
def test_padded_tokens_feed_neither_the_residual_context_nor_its_convolution(batch_first):
    mha = _converted_mha(batch_first, num_prefix_tokens=1)
    assert mha.residual[0].weight.dtype == torch.float64  # the predictor in the converted model's dtype
    x = torch.randn(3, 10, E, dtype=torch.float64)  # a prefix token and a 3x3 grid
    pad = torch.arange(10)[None] >= torch.tensor([10, 7, 4])[:, None]
    changed = x.masked_fill(pad[..., None], 0) + 100 * torch.randn_like(x) * pad[..., None]

    def run(t):
        t = t if batch_first else t.transpose(0, 1)
        out, _ = mha(t, t, t, key_padding_mask=pad)
        return out if batch_first else out.transpose(0, 1)

    out = run(x)
    assert torch.equal(out[~pad], run(changed)[~pad])  # padded tokens change no valid output
    ref = _reference(mha, x, x, x, pad, residual=True, prefix=1)
    torch.testing.assert_close(out[~pad], ref[~pad])


def test_residual_only_in_self_attention_whatever_the_lengths():
    mha = _converted_mha()
    x = torch.randn(2, 9, E, dtype=torch.float64)
    torch.testing.assert_close(mha(x, x, x)[0], _reference(mha, x, x, x, residual=True))
    for memory_tokens in (9, 16):  # cross-attention: V lies on the memory's positions, not on x's grid
        memory = torch.randn(2, memory_tokens, E, dtype=torch.float64)
        torch.testing.assert_close(mha(x, memory, memory)[0], _reference(mha, x, memory, memory))
    same_values = x.clone()  # one tensor as query, key and value makes self-attention, not equal values
    torch.testing.assert_close(mha(x, same_values, same_values)[0], _reference(mha, x, x, x))


@pytest.mark.parametrize("batch_first", [True, False])
def test_unbatched_input_as_torch_takes_it(batch_first):
    mha = _converted_mha(batch_first)
    x = torch.randn(9, E, dtype=torch.float64)
    pad = torch.arange(9) >= 7
    out, weights = mha(x, x, x, key_padding_mask=pad)
    assert out.shape == (9, E) and weights is None
    ref = _reference(mha, x[None], x[None], x[None], pad[None], residual=True)[0]
    torch.testing.assert_close(out[~pad], ref[~pad])
    memory = torch.randn(5, E, dtype=torch.float64)
    out, _ = mha(x, memory, memory)
    torch.testing.assert_close(out, _reference(mha, x[None], memory[None], memory[None])[0])


def test_converted_mha_refuses_inputs_by_name():
    mha = _converted_mha(kdim=6, vdim=5)
    x = torch.randn(2, 9, E, dtype=torch.float64)
    k, v = torch.randn(2, 4, 6, dtype=torch.float64), torch.randn(2, 4, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"query must be \[N, L, E\] .*E = 8, got shape \(2, 9, 4\)"):
        mha(x[..., :4], k, v)
    with pytest.raises(ValueError, match=r"key must be .*E = 6, got shape \(2, 4, 8\)"):
        mha(x, x[:, :4], v)
    with pytest.raises(ValueError, match=r"all batched or all unbatched, got shapes \(\(9, 8\), \(2, 4, 6\)"):
        mha(x[0], k, v)
    with pytest.raises(ValueError, match=r"key and value must have one length and batch"):
        mha(x, k, v[:, :3])
    with pytest.raises(ValueError, match=r"query has dtype torch.float32, expected torch.float64"):
        mha(x.float(), k, v)
    with pytest.raises(ValueError, match=r"query must be a torch.Tensor, got list"):
        mha([1.0] * 8, k, v)


def test_converted_mha_takes_autocast_inputs():
    mha = _converted_mha().float()
    x = torch.randn(2, 9, E)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = nn.functional.linear(x, torch.eye(E))  # a bfloat16 activation, as autocast's layers give
        out, _ = mha(h, h, h)
    assert h.dtype == torch.bfloat16 and out.shape == (2, 9, E)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (dict(local_residual="no"), r"local_residual must be a bool or None, got 'no'"),
        (dict(local_residual=1), r"local_residual must be a bool or None, got 1"),
        (dict(num_prefix_tokens=-1), r"num_prefix_tokens must be >= 0, got -1"),
        (dict(num_prefix_tokens="1"), r"num_prefix_tokens must be an int >= 0, got '1' \(str\)"),
        (dict(num_prefix_tokens=1.5), r"num_prefix_tokens must be an int >= 0, got 1.5 \(float\)"),
        (dict(num_prefix_tokens=True), r"num_prefix_tokens must be an int >= 0, got True \(bool\)"),
    ],
)
def test_convert_refuses_arguments_of_the_wrong_type(args, message):
    parent = nn.Module()
    parent.mha = nn.MultiheadAttention(E, HEADS)
    with pytest.raises(ValueError, match=message):
        inline_attn.convert(parent, **args)
    assert isinstance(parent.mha, nn.MultiheadAttention)  # refused before anything was replaced


@pytest.mark.parametrize("model", [[1, 2], None])
def test_convert_refuses_what_is_no_module(model):
    with pytest.raises(ValueError, match=f"convert takes an nn.Module .*got {type(model).__name__}"):
        inline_attn.convert(model)


def test_converted_mha_runs_on_meta_tensors():
    """Shape inference builds models on the meta device, where autocast has no state to ask for."""
    mha = _converted_mha().to("meta")
    x = torch.empty(2, 9, E, dtype=torch.float64, device="meta")
    out, weights = mha(x, x, x)
    assert out.shape == (2, 9, E) and out.device.type == "meta" and weights is None
