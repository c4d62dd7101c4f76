"""inline_attn.convert on stand-ins of timm's and torchvision's modules (tests/models/standins.py):
weights kept bit for bit, the same call signatures, forward and backward at two input sizes, the
local residual a no-op at the start, untouched parts untouched."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import inline_attn
from inline_attn.models.convert import (
    InLineEvaAttention,
    InLineMultiheadAttention,
    InLineTimmAttention,
    InLineWindowAttention,
)
from inline_attn.ops import attention

from standins import Attention, Eva, EvaAttention, SwinStage, TorchvisionViT, VisionTransformer


def _reference_inline(model_before: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The converted model's output computed by hand: the pretrained model with each softmax
    replaced by the float64 InLine reference (the zero-initialised residual adds nothing)."""
    import torch.nn.functional as F

    real = F.scaled_dot_product_attention

    def inline_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **_):
        return attention(q.double(), k.double(), v.double(), impl="naive").to(q.dtype)

    F.scaled_dot_product_attention = inline_sdpa
    try:
        return model_before(x)
    finally:
        F.scaled_dot_product_attention = real


def _grads_flow(model, x):
    model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_timm_vit_keeps_its_weights_and_runs_at_two_sizes():
    torch.manual_seed(0)
    model = VisionTransformer().eval()
    before = copy.deepcopy(model)
    changes = inline_attn.convert(model)
    assert [c.path for c in changes] == ["blocks.0.attn", "blocks.1.attn"]
    assert {(c.old_class, c.new_class) for c in changes} == {("Attention", "InLineTimmAttention")}
    assert changes[0].params_added == sum(p.numel() for p in model.blocks[0].attn.residual.parameters())
    assert "| blocks.0.attn | Attention | InLineTimmAttention |" in str(changes)
    old, new = before.state_dict(), model.state_dict()
    for name, tensor in old.items():  # every pretrained tensor, bit for bit, at its old name
        assert torch.equal(new[name], tensor), name
    assert all(".residual." in name for name in set(new) - set(old))
    for size in (16, 24):  # a 4x4 and a 6x6 patch grid
        x = torch.randn(2, 1, size, size)
        torch.testing.assert_close(model(x), _reference_inline(before, x), rtol=1e-5, atol=1e-5)
    _grads_flow(model, torch.randn(2, 1, 20, 12))  # H != W


def test_residual_starts_as_a_no_op_and_trains():
    torch.manual_seed(1)
    model = VisionTransformer()
    inline_attn.convert(model)
    attn = model.blocks[0].attn
    assert attn.residual[2].weight.abs().max() == 0 and attn.residual[2].bias.abs().max() == 0
    assert attn.grid.current is None
    _grads_flow(model, torch.randn(2, 1, 16, 16))
    assert attn.grid.current == (4, 4)
    assert attn.residual[2].weight.grad.abs().max() > 0  # it learns from the first step


def test_timm_attention_signature_and_causal_mode():
    torch.manual_seed(2)
    parent = nn.Module()
    parent.attn = Attention(24, num_heads=3, qkv_bias=True)
    inline_attn.convert(parent, local_residual=False)
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    parent.double()
    out = parent.attn(x, attn_mask=None, is_causal=True)
    assert out.shape == (2, 7, 24)
    with pytest.raises(ValueError, match="no attn_mask"):
        parent.attn(x, attn_mask=torch.zeros(7, 7))


def test_swin_window_attention_uses_the_window_and_drops_the_bias_table():
    torch.manual_seed(3)
    model = SwinStage()
    before = copy.deepcopy(model)
    changes = inline_attn.convert(model)
    assert isinstance(model.attn, InLineWindowAttention) and model.attn.window_size == (4, 4)
    assert changes[0].params_dropped == before.attn.relative_position_bias_table.numel()
    for name in ("qkv.weight", "qkv.bias", "proj.weight", "proj.bias"):
        assert torch.equal(model.attn.state_dict()[name], before.attn.state_dict()[name])
    assert torch.equal(model.norm.weight, before.norm.weight)  # parts not converted untouched
    for hw in ((8, 8), (8, 12)):
        x = torch.randn(2, *hw, 32)
        assert model(x).shape == x.shape
    _grads_flow(model, torch.randn(1, 4, 8, 32))
    assert model.attn(torch.randn(3, 16, 32), mask=torch.zeros(3, 16, 16)).shape == (3, 16, 32)


def test_torchvision_vit_multihead_attention_is_called_the_same_way():
    torch.manual_seed(4)
    model = TorchvisionViT().eval()
    before = copy.deepcopy(model)
    changes = inline_attn.convert(model)
    assert [c.new_class for c in changes] == ["InLineMultiheadAttention"] * 2
    old, new = before.state_dict(), model.state_dict()
    for name, tensor in old.items():
        assert torch.equal(new[name], tensor), name
    for size in (16, 24):
        x = torch.randn(2, 1, size, size)
        torch.testing.assert_close(model(x), _reference_inline(before, x), rtol=1e-5, atol=1e-5)
    _grads_flow(model, torch.randn(2, 1, 12, 20))


def test_torchvision_vit_self_attention_gets_the_residual():
    torch.manual_seed(4)
    model = TorchvisionViT().eval()
    before = copy.deepcopy(model)
    inline_attn.convert(model)
    with torch.no_grad():  # a trained residual: it must show in the output (mha(x, x, x) is self-attention)
        for layer in model.encoder.layers:
            layer.self_attention.residual[2].weight.normal_()
    x = torch.randn(2, 1, 16, 16)
    assert (model(x) - _reference_inline(before, x)).abs().max() > 1e-3


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_cross_and_padding(batch_first):
    torch.manual_seed(5)
    parent = nn.Module()
    parent.mha = nn.MultiheadAttention(16, 2, batch_first=batch_first).double()
    inline_attn.convert(parent)
    mha = parent.mha
    assert isinstance(mha, InLineMultiheadAttention) and mha.residual is None  # no grid in this model
    q, kv = torch.randn(3, 5, 16, dtype=torch.float64), torch.randn(3, 9, 16, dtype=torch.float64)
    pad = torch.arange(9)[None] >= torch.tensor([9, 4, 1])[:, None]
    args = (q, kv, kv) if batch_first else (q.transpose(0, 1), kv.transpose(0, 1), kv.transpose(0, 1))
    out, weights = mha(*args, key_padding_mask=pad)
    assert weights is None
    out = out if batch_first else out.transpose(0, 1)
    w_q, w_k, w_v = mha.in_proj_weight.chunk(3)
    b_q, b_k, b_v = mha.in_proj_bias.chunk(3)
    heads = [
        (t @ w.T + b).unflatten(-1, (2, 8)).transpose(1, 2)
        for t, w, b in ((q, w_q, b_q), (kv, w_k, b_k), (kv, w_v, b_v))
    ]
    ref = attention(*heads, impl="naive", key_padding_mask=pad).transpose(1, 2).flatten(2)
    torch.testing.assert_close(out, mha.out_proj(ref))


def test_convert_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="unknown kind"):
        inline_attn.convert(nn.Sequential(), kind="softmax")
    with pytest.raises(ValueError, match="needs the token grid"):
        parent = nn.Module()
        parent.attn = Attention(8, 2)
        inline_attn.convert(parent, local_residual=True)
    assert len(inline_attn.convert(nn.Sequential(nn.Linear(2, 2)))) == 0


def test_linear_kind_has_no_residual():
    model = VisionTransformer()
    changes = inline_attn.convert(model, kind="linear")
    assert all(c.params_added == 0 for c in changes)
    assert isinstance(model.blocks[0].attn, InLineTimmAttention) and model.blocks[0].attn.kind == "linear"
    assert model(torch.randn(1, 1, 16, 16)).shape == (1, 10)


def test_torch_transformer_encoder_runs_the_converted_attention_in_inference_too():
    """nn.TransformerEncoder(Layer)'s fused inference path computes softmax from in_proj_weight
    without calling self_attn: after convert it must not be taken."""
    torch.manual_seed(6)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True)
    changes = inline_attn.convert(encoder)
    assert [c.path for c in changes] == ["layers.0.self_attn", "layers.1.self_attn"]
    x = torch.randn(3, 6, 16)
    pad = torch.arange(6)[None] >= torch.tensor([6, 4, 2])[:, None]
    trained = encoder(x, src_key_padding_mask=pad)  # training mode: never the fast path
    with torch.no_grad():
        inferred = encoder.eval()(x, src_key_padding_mask=pad)
    torch.testing.assert_close(inferred[~pad], trained[~pad].detach())


@pytest.mark.parametrize("qkv_fused", [True, False])
def test_eva_without_rope_keeps_its_weights_and_runs_at_two_sizes(qkv_fused):
    torch.manual_seed(7)
    model = Eva(qkv_fused=qkv_fused).eval()
    with torch.no_grad():  # biases away from timm's zero init, so the Q / V bias path shows
        for name, p in model.named_parameters():
            if name.endswith(("q_bias", "v_bias")) or ".attn.norm." in name:
                p.normal_()
    before = copy.deepcopy(model)
    own = dict(model.blocks[0].attn.named_parameters())
    changes = inline_attn.convert(model)
    assert {(c.path, c.old_class, c.new_class) for c in changes} == {
        (f"blocks.{i}.attn", "EvaAttention", "InLineEvaAttention") for i in range(2)
    }
    old, new = before.state_dict(), model.state_dict()
    for name, tensor in old.items():  # every pretrained tensor, bit for bit, at its old name
        assert torch.equal(new[name], tensor), name
    assert all(".residual." in name for name in set(new) - set(old))
    attn = model.blocks[0].attn
    assert all(attn.get_parameter(name) is p for name, p in own.items())  # the same Parameters, trained on
    if qkv_fused:
        assert torch.equal(attn.k_bias, torch.zeros(32)) and "k_bias" not in attn.state_dict()
    for size in (16, 24):  # a 4x4 and a 6x6 patch grid
        x = torch.randn(2, 1, size, size)
        torch.testing.assert_close(model(x), _reference_inline(before, x), rtol=1e-5, atol=1e-5)
    _grads_flow(model, torch.randn(2, 1, 20, 12))  # H != W


def test_eva_attention_bias_layouts_and_gate_match_timm_projections():
    torch.manual_seed(8)
    for kwargs in ({"qkv_bias_separate": True}, {"gated": True}, {"qkv_bias": False}):
        parent = nn.Module()
        parent.attn = EvaAttention(24, num_heads=3, norm_layer=nn.LayerNorm, **kwargs).double()
        if parent.attn.q_bias is not None:
            with torch.no_grad():
                parent.attn.q_bias.normal_(), parent.attn.v_bias.normal_()
        before = copy.deepcopy(parent)
        inline_attn.convert(parent, local_residual=False)
        assert isinstance(parent.attn, InLineEvaAttention)
        x = torch.randn(2, 7, 24, dtype=torch.float64)
        torch.testing.assert_close(parent.attn(x, rope=None), _reference_inline(before.attn, x))
        parent.attn(x, is_causal=True).sum().backward()
        assert all(p.grad is not None for p in parent.parameters())


def test_eva_with_rope_is_refused_naming_rope():
    model = Eva(use_rot_pos_emb=True)
    with pytest.raises(ValueError, match=r"blocks\.0\.attn \(EvaAttention\).*rotary embeddings \(rope\)"):
        inline_attn.convert(model)
    assert isinstance(model.blocks[0].attn, EvaAttention)  # nothing replaced
    parent = nn.Module()  # converted on its own, it refuses rope when called with it
    parent.attn = EvaAttention(32, num_heads=4, scale_norm=False)
    inline_attn.convert(parent)
    with pytest.raises(ValueError, match="rotary embeddings \\(rope"):
        parent.attn(torch.randn(1, 5, 32), rope=torch.randn(4, 16))
