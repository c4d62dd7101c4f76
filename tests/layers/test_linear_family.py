"""The other linear attentions: each layer against a mirror of its paper's equations (float64)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from inline_attn.layers import ATTENTION_CHOICES, LINEAR_CORES, build_attention, record_attention
from inline_attn.ops import use_impl
from inline_attn.ops.linear_family import (
    agent_attention,
    agent_weights,
    naive_adaptive_avg_pool2d,
    naive_depthwise_conv2d,
    naive_grouped_pointwise,
)

# (dim, heads, prefix, H, W): batch 1 and 2, odd N, H != W, prefix tokens, one head
LAYOUTS = [(24, 3, 0, 5, 7), (24, 3, 1, 5, 7), (16, 2, 2, 3, 4), (12, 1, 0, 1, 1), (18, 3, 1, 4, 4)]
IDS = [f"C{c}-h{h}-P{p}-{a}x{b}" for c, h, p, a, b in LAYOUTS]
KINDS = tuple(LINEAR_CORES)


def _conv_grid(t, conv_w, groups, p, hw, bias=None):
    """A same-padded convolution of the grid tokens of t [B, P + HW, C] (prefix rows -> 0)."""
    b, _, c = t.shape
    h, w = hw
    img = t[:, p:].transpose(1, 2).reshape(b, c, h, w)
    pad = (conv_w.shape[2] // 2, conv_w.shape[3] // 2)
    out = F.conv2d(img, conv_w, bias, padding=pad, groups=groups).reshape(b, -1, h * w).transpose(1, 2)
    return torch.cat([torch.zeros(b, p, out.shape[2], dtype=t.dtype), out], 1)


def _linear(q, k, v, eps=1e-6):
    """Division-normalised linear attention written per query: sum_j (q_i.k_j) v_j / (sum_j q_i.k_j + eps)."""
    sim = torch.einsum("bhid,bhjd->bhij", q, k)
    return torch.einsum("bhij,bhjd->bhid", sim, v) / (sim.sum(-1, keepdim=True) + eps)


def _heads(t, h):
    b, n, c = t.shape
    return t.reshape(b, n, h, c // h).transpose(1, 2)


def _merge(t):
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def _head_shared_dwc(core, v, p, hw):
    """FLatten's and PolaFormer's DWC(V): one head_dim-channel depthwise conv applied to every head."""
    b, _, c = v.shape
    hd = c // core.num_heads
    vb = v[:, p:].transpose(1, 2).reshape(b * core.num_heads, hd, *hw)
    dwc = F.conv2d(vb, core.dwc.weight, core.dwc.bias, padding=core.dwc.padding, groups=hd)
    return torch.cat([torch.zeros(b, p, c, dtype=v.dtype), dwc.reshape(b, c, -1).transpose(1, 2)], 1)


def _rope(x, hw, p, base=10000.0):
    """MLLA's RoPE as the authors write it: complex pairs times exp(i angle), angles of (row, col)."""
    b, n, c = x.shape
    kmax = c // 4
    low = x.dtype
    x = x if low == torch.float64 else x.float()  # the authors rotate in float32 (no complex bf16)
    theta = 1 / base ** (torch.arange(kmax, dtype=x.dtype) / kmax)
    rows, cols = torch.meshgrid(torch.arange(hw[0]), torch.arange(hw[1]), indexing="ij")
    angles = torch.cat([rows[..., None] * theta, cols[..., None] * theta], -1).reshape(-1, 2 * kmax)
    rot = torch.polar(torch.ones_like(angles), angles)  # [HW, 2K]
    grid = torch.view_as_complex(x[:, p:, : 4 * kmax].reshape(b, n - p, 2 * kmax, 2).contiguous())
    turned = torch.view_as_real(grid * rot).reshape(b, n - p, 4 * kmax)
    grid_out = torch.cat([turned, x[:, p:, 4 * kmax :]], -1)
    return torch.cat([x[:, :p], grid_out], 1).to(low)


def mirror(m, x, hw):
    """Each paper's layer written out from its equations, sharing only the parameters of ``m``."""
    b, n, c = x.shape
    p, h, kind = m.num_prefix_tokens, m.num_heads, m.kind
    core = m.core
    q, k, v = m.qkv(x).chunk(3, dim=-1)
    if kind == "hydra":  # Bolya et al. Eq. 6: phi(Q) * sum_t phi(K)_t * V_t, phi = cosine over C
        qn, kn = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
        out = qn * (kn * v).sum(1, keepdim=True)
    elif kind == "efficient":  # Shen et al. Eq. 4: rho_q(Q) (rho_k(K)^T V)
        qs, ks, vs = _heads(q, h).softmax(-1), _heads(k, h).softmax(2), _heads(v, h)
        w = torch.einsum("bhid,bhjd->bhij", qs, ks)
        out = _merge(torch.einsum("bhij,bhjd->bhid", w, vs))
    elif kind == "angular":  # Castling-ViT: 1/2 v + (1/pi) q_hat k_hat^T v, row-normalised, + seq conv
        qh, kh, vh = _heads(q, h), _heads(k, h), _heads(v, h)
        qh, kh = qh / qh.norm(dim=-1, keepdim=True), kh / kh.norm(dim=-1, keepdim=True)
        raw = 0.5 * vh + torch.einsum("bhij,bhjd->bhid", torch.einsum("bhid,bhjd->bhij", qh, kh) / math.pi, vh)
        att = raw / raw.norm(dim=-1, keepdim=True)
        taps = core.dconv.weight[:, 0, :, 0]  # [h, 9]
        r = taps.shape[1] // 2
        conv = torch.zeros_like(vh)
        for i in range(n):
            for t in range(taps.shape[1]):
                j = i + t - r
                if 0 <= j < n:
                    conv[:, :, i] += taps[:, t, None] * vh[:, :, j]
        out = _merge(att + conv)
    elif kind == "relu_msa":  # EfficientViT: ReLU linear attention over q, k, v and their 5x5 aggregates
        qkv = torch.cat([q, k, v], -1)
        agg = _conv_grid(qkv, core.aggreg_dw.weight, 3 * c, p, hw)
        img = agg[:, p:].transpose(1, 2).reshape(b, 3 * c, *hw)
        img = F.conv2d(img, core.aggreg_pw.weight, groups=3 * h).reshape(b, 3 * c, -1).transpose(1, 2)
        agg = torch.cat([qkv[:, :p], img], 1)
        qa, ka, va = agg.chunk(3, -1)
        qq, kk, vv = (torch.cat([_heads(s, h), _heads(a, h)], 1) for s, a in ((q, qa), (k, ka), (v, va)))
        out = core.merge(_merge(_linear(F.relu(qq), F.relu(kk), vv)))
    elif kind == "focused":  # FLatten Eq. 5-6 + DWC(V) shared across heads
        s = F.softplus(core.scale)

        def focus(t):
            y = F.relu(t) / s + 1e-6
            return y.norm(dim=-1, keepdim=True) * y**core.power / (y**core.power).norm(dim=-1, keepdim=True)

        out = _merge(_linear(_heads(focus(q), h), _heads(focus(k), h), _heads(v, h)))
        out = out + _head_shared_dwc(core, v, p, hw)
    elif kind == "agent":  # Han et al. 2024 Eq. 3: softmax(Q A^T/sqrt d + B2) softmax(A K^T/sqrt d + B1) V + DWC(V)
        n_ag, d = core.agent_num, c // h
        img = q[:, p:].transpose(1, 2).reshape(b, c, *hw)
        agents = F.adaptive_avg_pool2d(img, core.pool_size).reshape(b, c, n_ag).transpose(1, 2)  # [B, n, C]
        qh, kh, vh, ah = _heads(q, h), _heads(k, h), _heads(v, h), _heads(agents, h)

        def grid_bias(t):  # the learnable 7 x 7 maps resized to the grid
            return F.interpolate(t, size=hw, mode="bilinear").reshape(h, n_ag, -1)

        b1 = torch.cat([core.prefix_key_bias.expand(h, n_ag, p), grid_bias(core.key_bias)], -1)
        b2 = torch.cat([core.prefix_query_bias.expand(h, p, n_ag), grid_bias(core.query_bias).transpose(1, 2)], 1)
        agg = torch.softmax(torch.einsum("bhad,bhjd->bhaj", ah, kh) / math.sqrt(d) + b1, -1)
        agent_v = torch.einsum("bhaj,bhjd->bhad", agg, vh)
        brd = torch.softmax(torch.einsum("bhid,bhad->bhia", qh, ah) / math.sqrt(d) + b2, -1)
        out = _merge(torch.einsum("bhia,bhad->bhid", brd, agent_v))
        out = out + _conv_grid(v, core.dwc.weight, c, p, hw, core.dwc.bias)
    elif kind == "polarity":  # Meng et al. 2025 Eq. 9-11 as the authors' code, DWC(V) shared by the heads, gate
        s = F.softplus(core.scale)
        pw = (1 + core.alpha * torch.sigmoid(core.power))[:, None]  # [h, 1, d]
        qh, kh, vh = _heads(q / s, h), _heads(k / s, h), _heads(v, h)
        qp, qn, kp, kn = F.relu(qh) ** pw, F.relu(-qh) ** pw, F.relu(kh) ** pw, F.relu(-kh) ** pw
        kf = torch.cat([kp, kn], -1)

        def term(qf, vv):  # q (K^T V / N) / (q . mean_j k_j + 1e-6)
            z = 1 / (torch.einsum("bhid,bhd->bhi", qf, kf.mean(2)) + 1e-6)
            sim = torch.einsum("bhid,bhjd->bhij", qf, kf)
            return torch.einsum("bhij,bhjd->bhid", sim, vv) / n * z[..., None]

        v_same, v_opp = vh.chunk(2, -1)
        out = torch.cat([term(torch.cat([qp, qn], -1), v_same), term(torch.cat([qn, qp], -1), v_opp)], -1)
        out = (_merge(out) + _head_shared_dwc(core, v, p, hw)) * core.gate(v)
    elif kind == "mlla":  # the authors' LinearAttention: ELU+1, RoPE in the numerator, LePE, silu gate
        qf, kf = F.elu(q) + 1, F.elu(k) + 1
        qr, kr = _rope(qf, hw, p), _rope(kf, hw, p)
        qh, kh, qrh, krh, vh = (_heads(t, h) for t in (qf, kf, qr, kr, v))
        z = 1 / (torch.einsum("bhid,bhd->bhi", qh, kh.mean(2)) + 1e-6)
        kv = torch.einsum("bhjd,bhje->bhde", krh * n**-0.5, vh * n**-0.5)
        out = _merge(torch.einsum("bhid,bhde->bhie", qrh, kv) * z[..., None])
        out = (out + _conv_grid(v, core.lepe.weight, c, p, hw, core.lepe.bias)) * F.silu(core.gate(v))
    else:
        raise AssertionError(kind)
    return m.proj(out)


def _grads(m, x, y):
    g = torch.autograd.grad(y.square().sum(), [x] + [t for t in m.parameters()], allow_unused=True)
    return [t for t in g if t is not None]


@pytest.mark.parametrize("c,nh,p,h,w", LAYOUTS, ids=IDS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("impl", ["eager", "naive"])
def test_layer_matches_its_paper_outputs_and_grads(kind, c, nh, p, h, w, impl):
    torch.manual_seed(0)
    m = build_attention(kind, c, nh, num_prefix_tokens=p).double()
    for prm in m.core.parameters():  # the convs and scales start at fixed values: randomise them
        torch.nn.init.normal_(prm, std=0.3)
    batch = 1 if h * w % 2 else 2
    x = torch.randn(batch, p + h * w, c, dtype=torch.float64, requires_grad=True)
    with use_impl(impl):
        y = m(x, (h, w))
    ref = mirror(m, x, (h, w))
    print(kind, impl, "max |diff|", (y - ref).abs().max().item())
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-12)
    got, want = _grads(m, x, y), _grads(m, x, ref)
    assert len(got) == len(want) == sum(1 for _ in m.parameters()) + 1  # every parameter gets a gradient
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("kind", KINDS)
def test_hook_sees_weights_and_can_replace_them(kind):
    """Hooks record explicit weights; the weights reproduce the layer (weights @ v is the core)."""
    m = build_attention(kind, 12, 3, num_prefix_tokens=1).double()
    x = torch.randn(2, 1 + 12, 12, dtype=torch.float64)
    y = m(x, (3, 4))
    with record_attention(m) as recs:
        y_hooked = m(x, (3, 4))
    torch.testing.assert_close(y_hooked, y, rtol=1e-10, atol=1e-12)
    heads = {"hydra": 12, "relu_msa": 6, "polarity": 6}.get(kind, 3)
    assert recs[0].kind == kind and recs[0].weights.shape == (2, heads, 13, 13)


def test_efficient_rows_sum_to_one_and_hydra_is_per_channel():
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 2, 9, 4, generator=g, dtype=torch.float64) for _ in range(2))
    from inline_attn.ops.linear_family import efficient_weights, hydra_weights

    torch.testing.assert_close(efficient_weights(q, k).sum(-1), torch.ones(1, 2, 9, dtype=torch.float64))
    w = hydra_weights(q[..., :1], k[..., :1])
    torch.testing.assert_close(w[0, 1, 3, 5], q[0, 1, 3, 0] * k[0, 1, 5, 0])


def test_naive_convolutions_equal_torch():
    x = torch.randn(2, 6, 5, 7, dtype=torch.float64)
    wd = torch.randn(6, 1, 5, 3, dtype=torch.float64)
    bias = torch.randn(6, dtype=torch.float64)
    torch.testing.assert_close(naive_depthwise_conv2d(x, wd, bias), F.conv2d(x, wd, bias, padding=(2, 1), groups=6))
    wp = torch.randn(6, 2, 1, 1, dtype=torch.float64)
    torch.testing.assert_close(naive_grouped_pointwise(x, wp, 3), F.conv2d(x, wp, groups=3))
    with pytest.raises(ValueError, match="odd kh, kw"):
        naive_depthwise_conv2d(x, torch.randn(6, 1, 2, 3))
    for size in ((3, 3), (7, 7), (2, 5)):  # fewer cells than pixels (overlapping bins) and more (repeats)
        torch.testing.assert_close(naive_adaptive_avg_pool2d(x, size), F.adaptive_avg_pool2d(x, size))


def test_agent_weights_are_the_product_of_two_softmaxes_and_rows_sum_to_one():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 11, 4, generator=g, dtype=torch.float64) for _ in range(3))
    agents = torch.randn(1, 2, 4, 4, generator=g, dtype=torch.float64)
    b1, b2 = torch.randn(1, 2, 4, 11, dtype=torch.float64), torch.randn(1, 2, 11, 4, dtype=torch.float64)
    w = agent_weights(q, k, agents, b1, b2, 0.5)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 11, dtype=torch.float64))
    torch.testing.assert_close(agent_attention(q, k, v, agents, b1, b2, 0.5), w @ v)


def test_bad_core_arguments_say_what_is_expected():
    with pytest.raises(ValueError, match="head_dim=3 must be even"):
        build_attention("polarity", 9, 3)
    with pytest.raises(ValueError, match="agent_num must be a square"):
        LINEAR_CORES["agent"](12, 3, agent_num=10)


def test_named_layers_are_the_kinds():
    import inline_attn.layers as L

    named = {
        "hydra": L.HydraAttention,
        "efficient": L.EfficientAttention,
        "angular": L.LinearAngularAttention,
        "relu_msa": L.ReLUMultiScaleAttention,
        "focused": L.FocusedLinearAttention,
        "agent": L.AgentAttention,
        "polarity": L.PolarityAttention,
        "mlla": L.MLLAAttention,
    }
    assert set(named) == set(KINDS)
    for kind, cls in named.items():
        m = cls(12, 3, num_prefix_tokens=1)
        assert m.kind == kind and m.core.kind == kind and m(torch.randn(1, 13, 12), (3, 4)).shape == (1, 13, 12)


def test_unknown_kind_and_feature_map_name_the_known_ones():
    with pytest.raises(ValueError, match="expected one of .*hydra.*focused"):
        build_attention("performer", 12, 3)
    with pytest.raises(ValueError, match="takes no feature_map"):
        build_attention("hydra", 12, 3, feature_map="relu")
    assert set(KINDS) <= set(ATTENTION_CHOICES)


@pytest.mark.parametrize("kind", ["agent", "polarity", "mlla"])
def test_new_kinds_under_bf16_autocast_are_as_accurate_as_plain_bf16(kind):
    """Within twice the error of the paper's equations run in plain bf16 (the sums that decide the
    result are taken in float32 under autocast)."""
    torch.manual_seed(0)
    m = build_attention(kind, 24, 3, num_prefix_tokens=1)
    for prm in m.core.parameters():
        torch.nn.init.normal_(prm, std=0.3)
    x = torch.randn(2, 1 + 9 * 11, 24)
    ref = m.double()(x.double(), (9, 11))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m.float()(x, (9, 11))
    plain = mirror(m.bfloat16(), x.bfloat16(), (9, 11))

    def rel(t):
        return ((t.double() - ref).norm() / ref.norm()).item()

    print(f"{kind}: relative L2 error autocast {rel(y):.3g}, plain bf16 {rel(plain):.3g}")
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    assert rel(y) <= 2 * rel(plain)
