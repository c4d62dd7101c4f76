"""Attention layers: equal to a mirror of the authors' module, fast == explicit, hooks, ablations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inline_attn.layers import (
    InLineAttention,
    LinearAttention,
    SoftmaxAttention,
    attention_layers,
    build_attention,
    hook_attention,
    record_attention,
    uses_local_residual,
)

# (dim, heads, prefix, H, W): D = 24, batch-1 friendly, odd N, H != W, cls token
LAYOUTS = [(72, 3, 0, 7, 9), (72, 3, 1, 5, 7), (48, 2, 1, 6, 6), (32, 4, 0, 1, 1), (24, 1, 2, 3, 4)]
IDS = [f"C{c}-h{h}-P{p}-{a}x{b}" for c, h, p, a, b in LAYOUTS]


def mirror_of_reference(m: InLineAttention, x: torch.Tensor, hw) -> torch.Tensor:
    """The authors' InLineAttention.forward written out (scale folded as sqrt into K and V; the
    residual on the grid tokens only), generalised to prefix tokens and H != W."""
    b, n, c = x.shape
    h, w = hw
    p, nh = m.num_prefix_tokens, m.num_heads
    d = c // nh
    q, k, v = m.qkv(x).reshape(b, n, 3, nh, d).permute(2, 0, 3, 1, 4)
    s = d**-0.5
    kv = (k.transpose(-2, -1) * (s / n) ** 0.5) @ (v * (s / n) ** 0.5)
    out = q @ kv + (1 - q @ k.mean(2, keepdim=True).transpose(-2, -1) * s) * v.mean(2, keepdim=True)
    out = out.transpose(1, 2).reshape(b, n, c)
    rw = torch.nn.Sequential.forward(m.residual, x.mean(1).unsqueeze(-1)).reshape(b * c, 1, 3, 3)
    v_img = v[:, :, p:].transpose(1, 2).reshape(b, h, w, c).permute(0, 3, 1, 2).reshape(1, b * c, h, w)
    res = F.conv2d(v_img, rw, padding=1, groups=b * c).reshape(b, c, h * w).transpose(1, 2)
    out = torch.cat([out[:, :p], out[:, p:] + res], 1)
    return m.proj(out)


@pytest.mark.parametrize("c,nh,p,h,w", LAYOUTS, ids=IDS)
@pytest.mark.parametrize("batch", [1, 2])
def test_inline_layer_equals_reference_mirror(c, nh, p, h, w, batch):
    m = InLineAttention(c, nh, num_prefix_tokens=p).double()
    x = torch.randn(batch, p + h * w, c, dtype=torch.float64)
    torch.testing.assert_close(m(x, (h, w)), mirror_of_reference(m, x, (h, w)), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("c,nh,p,h,w", LAYOUTS, ids=IDS)
@pytest.mark.parametrize(
    "kind,kw",
    [("inline", {}), ("inline", {"feature_map": "affine_relu"}), ("linear", {"local_residual": True}), ("softmax", {})],
    ids=["inline", "inline-affine", "linear+res", "softmax"],
)
def test_fast_equals_explicit_weights_outputs_and_grads(c, nh, p, h, w, kind, kw):
    """A no-op hook forces the explicit-weights path: outputs and every parameter's gradient agree."""
    torch.manual_seed(0)
    m = build_attention(kind, c, nh, num_prefix_tokens=p, **kw).double()
    x = torch.randn(2, p + h * w, c, dtype=torch.float64, requires_grad=True)
    y_fast = m(x, (h, w))
    g = torch.randn_like(y_fast)
    params = [x] + list(m.parameters())
    grads_fast = torch.autograd.grad(y_fast, params, g)
    with hook_attention(m, lambda rec: None):
        y_exp = m(x, (h, w))
    grads_exp = torch.autograd.grad(y_exp, params, g)
    torch.testing.assert_close(y_fast, y_exp, rtol=1e-10, atol=1e-10)
    for gf, ge in zip(grads_fast, grads_exp):
        torch.testing.assert_close(gf, ge, rtol=1e-9, atol=1e-9)


def test_every_parameter_gets_a_gradient_including_residual():
    m = InLineAttention(48, 3, num_prefix_tokens=1, feature_map="affine_relu")
    m(torch.randn(2, 1 + 20, 48), (4, 5)).square().sum().backward()
    for name, prm in m.named_parameters():
        assert prm.grad is not None and prm.grad.abs().sum() > 0, name


def test_residual_naive_and_fast_agree_inside_layer():
    m = InLineAttention(24, 2).double()
    v = torch.randn(2, 24, 5, 3, dtype=torch.float64)
    ctx = torch.randn(2, 24, dtype=torch.float64)
    torch.testing.assert_close(m.residual(v, ctx), m.residual(v, ctx, impl="naive"))


def test_state_dict_names_match_reference_layout():
    keys = set(InLineAttention(96, 3).state_dict())
    assert keys == {
        "qkv.weight",
        "qkv.bias",
        "proj.weight",
        "proj.bias",
        "residual.0.weight",
        "residual.0.bias",
        "residual.2.weight",
        "residual.2.bias",
    }
    sd = InLineAttention(96, 3).state_dict()
    assert sd["residual.0.weight"].shape == (96, 32, 1) and sd["residual.2.weight"].shape == (864, 32, 1)
    assert set(SoftmaxAttention(96, 3).state_dict()) == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"}


def test_uses_local_residual_default_is_inline_only_and_explicit_wins():
    assert uses_local_residual("inline", None) and not uses_local_residual("linear", None)
    assert not uses_local_residual("softmax", None)
    assert uses_local_residual("linear", True) and not uses_local_residual("inline", False)
    assert InLineAttention(16, 2).residual is not None and LinearAttention(16, 2).residual is None


def test_same_signature_for_all_kinds():
    x = torch.randn(2, 1 + 12, 32)
    for cls in (InLineAttention, LinearAttention, SoftmaxAttention):
        y = cls(32, 4, num_prefix_tokens=1)(x, (3, 4))
        assert y.shape == x.shape and torch.isfinite(y).all()


class _TwoLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = InLineAttention(16, 2, num_prefix_tokens=1)
        self.b = SoftmaxAttention(16, 2, num_prefix_tokens=1)

    def forward(self, x, hw):
        return self.b(self.a(x, hw), hw)


def test_record_attention_collects_weights_without_changing_outputs():
    model = _TwoLayer().eval()
    x = torch.randn(3, 1 + 6, 16)
    y = model(x, (2, 3))
    with record_attention(model) as recs:
        y2 = model(x, (2, 3))
    torch.testing.assert_close(y, y2)
    assert [r.name for r in recs] == ["a", "b"] and [r.index for r in recs] == [0, 1]
    assert [r.kind for r in recs] == ["inline", "softmax"]
    for r in recs:
        assert r.weights.shape == (3, 2, 7, 7) and r.feat_size == (2, 3) and r.num_prefix_tokens == 1
        torch.testing.assert_close(r.weights.sum(-1), torch.ones(3, 2, 7))
    assert model.a._attention_hook is None  # uninstalled on exit
    with record_attention(model, layers=["b"]) as recs:
        model(x, (2, 3))
    assert [r.name for r in recs] == ["b"]


def test_hook_can_replace_weights():
    model = _TwoLayer().eval()
    x = torch.randn(1, 1 + 4, 16)

    def uniform(rec):
        return torch.full_like(rec.weights, 1.0 / rec.weights.shape[-1])

    with hook_attention(model, uniform, layers=[0]):
        y = model.a(x, (2, 2))
    qkv = model.a.qkv(x).view(1, 5, 3, 2, 8)
    v_mean = qkv[:, :, 2].mean(1).reshape(1, 1, 16)
    # uniform weights: every token's attention output is the value mean; + residual on grid tokens
    v_img = qkv[:, 1:, 2].reshape(1, 2, 2, 16).permute(0, 3, 1, 2)
    res = model.a.residual(v_img, x.mean(1)).permute(0, 2, 3, 1).reshape(1, 4, 16)
    expected = model.a.proj(torch.cat([v_mean, v_mean.expand(1, 4, 16) + res], 1))
    torch.testing.assert_close(y, expected)


def test_hook_layer_selection_errors():
    model = _TwoLayer()
    assert [n for n, _ in attention_layers(model)] == ["a", "b"]
    with pytest.raises(ValueError, match="layer index 5 out of range: the model has 2"):
        with hook_attention(model, lambda r: None, layers=[5]):
            pass
    with pytest.raises(ValueError, match="no attention layer matches 'zz'"):
        with hook_attention(model, lambda r: None, layers=["zz"]):
            pass
    with pytest.raises(ValueError, match="returned weights of shape"):
        with hook_attention(model, lambda r: r.weights[..., :1]):
            model(torch.randn(1, 5, 16), (2, 2))


@pytest.mark.parametrize("layers", [range(1, 2), ("b",), {"b"}], ids=["range", "tuple", "set"])
def test_hook_layer_selection_takes_any_collection(layers):
    model = _TwoLayer().eval()
    with record_attention(model, layers=layers) as recs:
        model(torch.randn(1, 1 + 4, 16), (2, 2))
    assert [r.name for r in recs] == ["b"]


@pytest.mark.parametrize("layers", [[1.5], 1.5, [True], [0, None]], ids=["float", "bare-float", "bool", "none-in-list"])
def test_hook_layer_selection_of_another_type_is_refused(layers):
    """A float reached fnmatch's TypeError; True picked layer 1."""
    with pytest.raises(ValueError, match=r"layers=.*: expected None, a layer index \(int\), a name pattern \(str\)"):
        with record_attention(_TwoLayer(), layers=layers):
            pass


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"local_residual": "no"}, "local_residual must be a bool or None, got 'no'"),
        ({"local_residual": 0}, "local_residual must be a bool or None, got 0"),
        ({"qkv_bias": "no"}, "qkv_bias must be a bool, got 'no'"),
        ({"split_qkv": 1}, "split_qkv must be a bool, got 1"),
    ],
)
@pytest.mark.parametrize("kind", ["inline", "linear"])
def test_a_flag_that_is_not_a_bool_is_refused(kind, kwargs, message):
    """local_residual="no" turned the residual on and qkv_bias="no" kept the bias (truthy strings)."""
    with pytest.raises(ValueError, match=message):
        build_attention(kind, 8, 2, **kwargs)
    with pytest.raises(ValueError, match=message):
        (InLineAttention if kind == "inline" else LinearAttention)(8, 2, **kwargs)


@pytest.mark.parametrize(
    "dim, heads, message",
    [
        (8, 3, "dim=8 must be a positive multiple of num_heads=3"),
        (0, 1, "dim must be >= 1, got 0"),
        (8, 0, "num_heads"),
    ],
)
def test_local_residual_refuses_channels_its_groups_cannot_split(dim, heads, message):
    from inline_attn.layers import LocalResidual

    with pytest.raises(ValueError, match=message):
        LocalResidual(dim, heads)


def test_a_layer_called_with_a_list_is_a_type_error():
    with pytest.raises(ValueError, match=r"x must be a torch.Tensor \[B, N, 8\], got list"):
        InLineAttention(8, 2)([[0.0] * 8], (1, 1))


def test_init_weights_keeps_learnable_feature_map_identity_start():
    from inline_attn.layers import init_weights_

    m = InLineAttention(24, 2, feature_map="affine_relu")
    torch.nn.init.normal_(m.feature_map.affine.weight)
    init_weights_(m)
    torch.testing.assert_close(m.feature_map.affine.weight, torch.eye(12))
    # trunc-normal std 0.02 (bounds +-2 absolute, as timm); 1728 samples estimate the std to ~2 %
    assert m.qkv.bias.abs().sum() == 0 and 0.017 < m.qkv.weight.std().item() < 0.023


@pytest.mark.parametrize("kind", ["inline", "linear", "softmax", "focused"])
@pytest.mark.parametrize("local_residual", [None, True, False])
def test_one_residual_default_for_every_layer(kind, local_residual):
    # None means the paper's models: the residual on InLine only; a given value always wins
    expected = kind == "inline" if local_residual is None else local_residual
    assert uses_local_residual(kind, local_residual) is expected
    layer = build_attention(kind, 8, 2, local_residual=local_residual)
    assert (layer.residual is not None) is expected
