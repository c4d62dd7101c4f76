"""``impl`` chosen at construction: ``create_model(name, impl=...)`` reaches every attention layer
and changes the path they take, not the result."""

from __future__ import annotations

import pytest
import torch
from model_helpers import SMALL_OVERRIDES

import inline_attn.ops as ops
from inline_attn import create_model
from inline_attn.layers import attention_layers
from inline_attn.ops import IMPLS
from inline_attn.ops import tokens as tokens_mod


@pytest.fixture
def paths(monkeypatch):
    """The paths the attention layers took: "fused", "naive-inline" (inline_tokens' reference) and
    "naive-<kind>" (attention()'s reference)."""
    taken = []

    def spy(module, name, label):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, **kw: taken.append(label(kw)) or real(*a, **kw))

    spy(tokens_mod, "inline_core", lambda kw: "fused")
    spy(tokens_mod, "inline_layer_core", lambda kw: "fused")  # the core with the layer's residual predictor
    spy(tokens_mod, "naive_attention", lambda kw: "naive-inline")
    spy(ops, "naive_attention", lambda kw: f"naive-{kw['kind']}")
    return taken


@pytest.mark.parametrize("family", sorted(SMALL_OVERRIDES))
def test_create_model_impl_naive_takes_the_naive_path_with_the_same_output(family, paths):
    name = f"inline_{family}_tiny"
    torch.manual_seed(0)
    default = create_model(name, **SMALL_OVERRIDES[family]).eval()
    naive = create_model(name, impl="naive", **SMALL_OVERRIDES[family]).eval()
    naive.load_state_dict(default.state_dict())
    assert {layer.impl for _, layer in attention_layers(naive)} == {"naive"}
    assert "impl" not in naive.model_args  # how the model computes, not what it is
    size = SMALL_OVERRIDES[family]["img_size"]
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        want = default(x)
        assert "fused" in paths and not any(p.startswith("naive") for p in paths)
        paths.clear()
        got = naive(x)
    assert paths and all(p.startswith("naive") for p in paths)
    print(family, "max |diff|", (got - want).abs().max().item())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_create_model_refuses_an_unknown_impl():
    listed = r"impl='fast'\): expected one of \('auto', 'naive', 'eager', 'cpu', 'triton'\)"
    with pytest.raises(ValueError, match=listed):
        create_model("inline_deit_tiny", impl="fast")
    assert IMPLS == ("auto", "naive", "eager", "cpu", "triton")


def test_set_impl_none_restores_the_process_default():
    model = create_model("inline_deit_tiny", depth=1, impl="eager")
    model.set_impl(None)
    assert {layer.impl for _, layer in attention_layers(model)} == {None}
    with pytest.raises(ValueError, match="unknown impl 'fused'"):
        model.set_impl("fused")
