"""InLine-CSwin: golden output, reference layouts, stripe semantics at any size, backbone API."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from model_helpers import assert_close_rel, count_params, load_golden, meta_model, reference_layout, state_layout

from inline_attn import create_model, get_model_config, load_checkpoint, record_attention
from inline_attn.models.cswin import CSwinBlock, InLineCSwin, StripeAttention

CSWIN_NAMES = ["inline_cswin_tiny", "inline_cswin_small", "inline_cswin_base", "inline_cswin_base_384"]
PUBLISHED_PARAMS = {  # exact, as the reference code builds them
    "inline_cswin_tiny": 20_604_520,
    "inline_cswin_small": 33_032_872,
    "inline_cswin_base": 73_413_640,
    "inline_cswin_base_384": 73_413_640,
}
# the tiny structure at 224 (stripes 1-2-7-7, InLine splits global) with few channels and blocks
SMALL_224 = dict(embed_dim=8, depths=(1, 1, 2, 1), num_heads=(2, 2, 2, 2), num_classes=5)


def test_golden_output(float64):
    meta, data = load_golden("cswin_tiny_cfg")
    kw = meta["kwargs"]
    model = InLineCSwin(
        img_size=kw["img_size"],
        embed_dim=kw["embed_dim"],
        depths=kw["depth"],
        num_heads=kw["num_heads"],
        split_size=kw["split_size"],
        inline_split_size=kw["la_split_size"],
        pattern=kw["attn_type"],
        num_classes=kw["num_classes"],
    ).eval()
    model.load_state_dict(data["model"], strict=True)
    with torch.no_grad():
        out = model(data["input"])
    assert out.dtype == torch.float64
    assert_close_rel(out, data["output"], rtol=1e-10)


def test_authors_checkpoint_loads_into_backbone(float64):
    """The golden weights wrapped as the authors' .pth ({"model": sd}) load strictly into the
    classifier and into a features_only backbone (which drops norm, head and stage 4); the
    backbone's maps equal the classifier's intermediates."""
    meta, data = load_golden("cswin_tiny_cfg")
    kw = meta["kwargs"]
    args = dict(
        img_size=kw["img_size"],
        embed_dim=kw["embed_dim"],
        depths=kw["depth"],
        num_heads=kw["num_heads"],
        split_size=kw["split_size"],
        inline_split_size=kw["la_split_size"],
        pattern=kw["attn_type"],
    )
    full = InLineCSwin(num_classes=kw["num_classes"], **args).eval()
    backbone = InLineCSwin(**args).to_features_only(out_indices=(0, 1, 2)).eval()
    assert load_checkpoint(full, {"model": data["model"]}).ok
    assert load_checkpoint(backbone, {"model": data["model"]}).ok
    x = data["input"][..., :160, :96]  # non-square, stage-3 map 10 x 6 (stripes 7: remainders)
    with torch.no_grad():
        ref = full.forward_intermediates(x, intermediates_only=True)
        maps = backbone(x)
    assert len(maps) == 3
    for m, r in zip(maps, ref):
        torch.testing.assert_close(m, r, rtol=0, atol=0)


@pytest.mark.parametrize("name", CSWIN_NAMES)
def test_reference_layout_and_params(name):
    model = meta_model(name)
    assert state_layout(model) == reference_layout(name)
    assert count_params(model) == PUBLISHED_PARAMS[name] == get_model_config(name).num_params


def test_published_structure():
    """IISS at 224: every InLine block is one global branch; softmax stages 3 keep two stripe
    branches (7 < 14), stage 4 one; base_384 uses 12-wide stripes."""
    tiny = meta_model("inline_cswin_tiny")
    assert [a.mode for a in tiny.stage1[0].attns] == ["global"]
    assert tiny.stage1[0].attns[0].kind == "inline" and tiny.stage2[3].attns[0].kind == "inline"
    assert [(a.kind, a.mode, a.split_size) for a in tiny.stage3[0].attns] == [
        ("softmax", "vertical", 7),
        ("softmax", "horizontal", 7),
    ]
    assert [a.mode for a in tiny.stage4[0].attns] == ["global"]
    b384 = meta_model("inline_cswin_base_384")
    assert [a.mode for a in b384.stage1[0].attns] == ["global"]
    assert [a.split_size for a in b384.stage3[0].attns] == [12, 12]
    assert get_model_config("inline_cswin_base_384").input_size == (3, 384, 384)


# -- stripes against an independent dense-mask definition --------------------------------------


def _dense_branch(attn: StripeAttention, q, k, v, feat_size, context):
    """The branch written with an N x N stripe mask: token i attends to token j iff they share a
    stripe (stripe = col // split for vertical, row // split for horizontal, one for global);
    LePE and the local residual are convolutions of each stripe's V alone (zero outside)."""
    b, n, c = q.shape
    h, w = feat_size
    hd = attn.head_dim
    rows, cols = torch.arange(h).repeat_interleave(w), torch.arange(w).repeat(h)
    stripe = {
        "global": torch.zeros(n, dtype=torch.long),
        "vertical": cols // attn.split_size,
        "horizontal": rows // attn.split_size,
    }[attn.mode]
    same = stripe[:, None] == stripe[None, :]  # [N, N]
    qh, kh, vh = (t.view(b, n, attn.num_heads, hd).transpose(1, 2) for t in (q, k, v))
    if attn.kind == "softmax":
        logits = (qh @ kh.transpose(-2, -1)) * hd**-0.5
        weights = logits.masked_fill(~same, float("-inf")).softmax(-1)
    else:  # InLine, identity feature map: (1 + s q.(k_j - mean_{S(i)} k)) / |S(i)| on i's stripe
        size = same.sum(-1, keepdim=True).to(q.dtype)  # [N, 1]
        k_bar = (same.to(q.dtype) @ kh) / size  # mean key of each token's stripe
        raw = (qh @ kh.transpose(-2, -1) - (qh * k_bar).sum(-1, keepdim=True)) * hd**-0.5
        weights = torch.where(same, (1 + raw) / size, torch.zeros((), dtype=q.dtype))
    out = (weights @ vh).transpose(1, 2).reshape(b, n, c)
    v_img = v.transpose(1, 2).reshape(b, c, h, w)
    res_w = attn.residual.predict(context) if attn.residual is not None else None
    for s in stripe.unique():
        inside = (stripe == s).view(1, 1, h, w)
        v_s = v_img * inside
        extra = F.conv2d(v_s, attn.get_v.weight, attn.get_v.bias, padding=1, groups=c)
        if res_w is not None:
            extra = extra + torch.cat(
                [F.conv2d(v_s[i : i + 1], res_w[i].unsqueeze(1), padding=1, groups=c) for i in range(b)]
            )
        out = out + (extra * inside).flatten(2).transpose(1, 2)
    return out


@pytest.mark.parametrize("kind", ["softmax", "inline"])
@pytest.mark.parametrize("mode,split", [("vertical", 4), ("horizontal", 2), ("vertical", 12), ("global", 1)])
def test_stripe_branch_matches_dense_definition(float64, kind, mode, split):
    """5 x 9 map: split 4 leaves a remainder stripe of width 1, split 2 of height 1; split 12 is
    clamped to the map; global covers the non-square map."""
    attn = StripeAttention(12, 3, mode=mode, split_size=split, kind=kind).eval()
    for p in attn.parameters():  # non-trivial LePE and residual weights
        torch.nn.init.normal_(p, std=0.3)
    h, w, b = 5, 9, 2
    q, k, v = (torch.randn(b, h * w, 12) for _ in range(3))
    ctx = torch.randn(b, 12)
    out = attn(q, k, v, (h, w), ctx)
    ref = _dense_branch(attn, q, k, v, (h, w), ctx)
    assert_close_rel(out, ref, rtol=1e-12)


REMAINDERS = [  # (mode, split, (H, W), batch): the last stripe narrower, H != W, batch 1
    ("vertical", 4, (5, 9), 2),
    ("horizontal", 3, (7, 4), 1),
    ("vertical", 5, (3, 7), 1),
    ("horizontal", 2, (5, 9), 2),
]


# Triton (under its interpreter, seconds a case) on the batch-1 shapes only
IMPL_CASES = [(impl, *case) for impl in ("eager", "cpu") for case in REMAINDERS]
IMPL_CASES += [("triton", *case) for case in REMAINDERS if case[3] == 1]


@pytest.mark.parametrize("impl,mode,split,grid,b", IMPL_CASES, ids=lambda v: str(v))
def test_inline_remainder_stripe_in_one_core_call(impl, mode, split, grid, b):
    """InLine stripes with a narrower last stripe (padded into the full stripes' one core call):
    outputs and the gradients of q, k, v, the context and every parameter against the dense-mask
    definition in float64 (Triton: float32 under the interpreter, against the same float64 reference)."""
    if impl == "triton":
        pytest.importorskip("triton")
    dtype = torch.float32 if impl == "triton" else torch.float64
    torch.manual_seed(0)
    attn = StripeAttention(12, 3, mode=mode, split_size=split, kind="inline", impl=impl).double()
    for p in attn.parameters():  # non-trivial LePE and residual weights
        torch.nn.init.normal_(p, std=0.3)
    h, w = grid
    inputs = [torch.randn(b, h * w, 12, dtype=torch.float64) for _ in range(3)] + [
        torch.randn(b, 12, dtype=torch.float64)
    ]
    g = torch.randn(b, h * w, 12, dtype=torch.float64)

    def run(module, dt, fn):
        xs = [t.to(dt).requires_grad_() for t in inputs]
        out = fn(module, *xs[:3], (h, w), xs[3])
        return out, torch.autograd.grad((out * g.to(dt)).sum(), (*xs, *module.parameters()))

    ref, ref_grads = run(attn, torch.float64, _dense_branch)
    out, grads = run(attn.to(dtype), dtype, StripeAttention.__call__)
    rtol = 1e-5 if dtype == torch.float32 else 1e-12
    assert_close_rel(out.double(), ref, rtol=rtol)
    for got, want in zip(grads, ref_grads):
        assert_close_rel(got.double(), want, rtol=rtol)


class _CoreCalls(TorchDispatchMode):
    """Records the fused core's ops (under a dispatch mode the fused path runs as its custom op)
    in ``calls``, and every aten op's name in ``ops``."""

    def __init__(self):
        super().__init__()
        self.calls, self.ops = [], set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        (self.calls.append(name) if func.namespace == "inline_attn" else self.ops.add(name))
        return func(*args, **(kwargs or {}))


def test_each_direction_calls_the_core_once():
    """A two-branch InLine block on a 5 x 7 map with stripes of 3 (a narrower last stripe in both
    directions): one core call each way per direction, as its custom op and as Triton launches,
    and no slice gradients."""
    block = CSwinBlock(16, 4, kind="inline", split_size=3)
    for attn in block.attns:
        attn.impl = "cpu"
    x = torch.randn(1, 35, 16, requires_grad=True)
    with _CoreCalls() as mode:
        block(x, (5, 7)).sum().backward()
    assert sorted(mode.calls) == ["inline_backward"] * 2 + ["inline_forward"] * 2
    # on a map the stripes divide, the branches take their channel halves as views whose gradients
    # join in one op each, not as slices (a zero-filled copy and an addition per slice)
    x6 = torch.randn(1, 36, 16, requires_grad=True)
    with _CoreCalls() as mode:
        block(x6, (6, 6)).sum().backward()
    assert "slice_backward" not in mode.ops, sorted(mode.ops)
    pytest.importorskip("triton")
    from inline_attn.ops.fused.triton import record_launches

    for attn in block.attns:
        attn.impl = "triton"
    with record_launches() as launched:
        block(x, (5, 7)).sum().backward()
    assert sorted(x.kernel for x in launched) == ["inline_bwd_stream"] * 2 + ["inline_fwd_resident"] * 2


def test_records_cover_the_map_once():
    """An indivisible stripe branch records its full stripes and its remainder stripe; together
    their token_coords cover every map position exactly once, and rows sum to one."""
    attn = StripeAttention(8, 2, mode="vertical", split_size=4, kind="softmax").eval()
    h, w = 3, 10
    x = torch.randn(1, h * w, 8)
    with torch.no_grad(), record_attention(attn) as recs:
        attn(x, x, x, (h, w), x.mean(1))
    assert [tuple(r.weights.shape) for r in recs] == [(2, 2, 12, 12), (1, 2, 6, 6)]
    coords = torch.cat([r.token_coords.reshape(-1, 2) for r in recs])
    assert sorted(map(tuple, coords.tolist())) == [(i, j) for i in range(h) for j in range(w)]
    for r in recs:
        torch.testing.assert_close(r.weights.sum(-1), torch.ones_like(r.weights.sum(-1)))


# -- the whole model at other sizes ----------------------------------------------------------


@pytest.mark.parametrize("size", [(224, 320), (256, 256), (96, 64)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_any_input_size(size):
    """224x320: stage-3 stripes 7 over a 14 x 20 map (remainder 6); 256: 16 x 16 (remainder 2);
    96x64: maps smaller than the stripes (clamped)."""
    model = create_model("inline_cswin_tiny", **SMALL_224).eval()
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        out = model(x)
        maps = model.forward_intermediates(x, intermediates_only=True)
    assert out.shape == (2, 5) and torch.isfinite(out).all()
    for m, info in zip(maps, model.feature_info):
        assert m.shape == (2, info["num_chs"], size[0] // info["reduction"], size[1] // info["reduction"])


def test_inline_and_linear_stripes_with_remainder():
    """Ablation layouts: InLine stripes (split 5 over a 16-wide map) and linear global blocks."""
    model = InLineCSwin(
        img_size=64,
        embed_dim=8,
        depths=(1, 1, 1, 1),
        num_heads=(2, 2, 2, 2),
        inline_split_size=(5, 8, 4, 2),
        pattern="ILSS",
        num_classes=3,
    ).eval()
    assert [a.mode for a in model.stage1[0].attns] == ["vertical", "horizontal"]
    assert model.stage2[0].attns[0].kind == "linear" and model.stage2[0].attns[0].residual is None
    with torch.no_grad(), record_attention(model, layers="stage1.*") as recs:
        out = model(torch.randn(1, 3, 64, 80))
    assert torch.isfinite(out).all()
    # 16 x 20 map, width-5 stripes: 4 full vertical stripes; 3 full horizontal + one of height 1
    assert [tuple(r.weights.shape[:1]) + tuple(r.weights.shape[2:]) for r in recs] == [
        (4, 80, 80),
        (3, 100, 100),
        (1, 20, 20),
    ]


# -- backbone contract ---------------------------------------------------------------------------


def test_features_only_channels_and_strides():
    model = create_model("inline_cswin_tiny", features_only=True, **SMALL_224).eval()
    assert [(i["num_chs"], i["reduction"]) for i in model.feature_info] == [(8, 4), (16, 8), (32, 16), (64, 32)]
    x = torch.randn(1, 3, 128, 96)
    with torch.no_grad():
        maps = model(x)
    assert [tuple(m.shape) for m in maps] == [
        (1, c, 128 // r, 96 // r) for c, r in [(8, 4), (16, 8), (32, 16), (64, 32)]
    ]
    last2 = create_model("inline_cswin_tiny", features_only=True, out_indices=(2, 3), **SMALL_224)
    assert [i["reduction"] for i in last2.feature_info] == [16, 32]
    early = create_model("inline_cswin_tiny", features_only=True, out_indices=(0, 1), **SMALL_224).eval()
    assert early.stage3 is None and early.merge2 is None and early.stage4 is None and early.merge3 is None
    assert not any(k.startswith(("stage3", "stage4", "merge2", "merge3", "norm", "head")) for k in early.state_dict())
    with torch.no_grad():
        for m, r in zip(early(x), maps[:2]):
            assert m.shape == r.shape


def test_intermediates_match_forward():
    model = create_model("inline_cswin_tiny", **SMALL_224).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x, indices=2, norm=True)
        feats = model.forward_features(x)
    assert len(maps) == 2 and maps[-1].shape == (1, 64, 2, 2)
    torch.testing.assert_close(final, feats)
    torch.testing.assert_close(maps[-1].flatten(2).transpose(1, 2), feats)  # norm on the last map
    torch.testing.assert_close(model.forward_head(final), model(x))


def test_gradients_and_checkpointing():
    model = create_model("inline_cswin_tiny", pattern="ILSS", drop_path_rate=0.0, **SMALL_224).train()
    x = torch.randn(2, 3, 64, 96)
    out = model(x)
    out.square().sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing
    model.set_grad_checkpointing(True)
    torch.testing.assert_close(model(x), out)


def test_classifier_and_no_weight_decay():
    model = create_model("inline_cswin_tiny", **SMALL_224)
    assert model.no_weight_decay() == set() and model.num_prefix_tokens == 0 and model.num_features == 64
    model.reset_classifier(11)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 11)
    model.reset_classifier(0)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 64)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(pattern="IIS"), "pattern"),
        (dict(pattern="IIXS"), "pattern"),
        (dict(pattern="IIMS"), "M"),
        (dict(inline_split_size="56-28-14"), "inline_split_size"),
        (dict(num_heads=(1, 2, 2, 2), pattern="SSSS"), "two-branch"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        create_model("inline_cswin_tiny", **{**SMALL_224, **kwargs})


def test_feature_map_and_residual_ablations():
    """feature_map / local_residual reach the InLine blocks only; softmax blocks stay plain CSwin."""
    model = create_model("inline_cswin_tiny", feature_map="relu", local_residual=False, **SMALL_224).eval()
    inline, softmax = model.stage1[0].attns[0], model.stage3[0].attns[0]
    assert inline.feature_map == "relu" and inline.residual is None
    assert softmax.feature_map is None and softmax.residual is None
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(1, 3, 64, 64))).all()
    with_res = meta_model("inline_cswin_tiny", pattern="LLSS", local_residual=True)
    assert with_res.stage1[0].attns[0].residual is not None and with_res.stage3[0].attns[0].residual is None


def test_mixed_pattern():
    model = meta_model("inline_cswin_small", pattern="IIMS3")
    kinds = [blk.kind for blk in model.stage3]
    assert kinds[:3] == ["inline"] * 3 and set(kinds[3:]) == {"softmax"} and len(kinds) == 29
    assert math.isclose(get_model_config("inline_cswin_tiny").paper_top1, 83.2)
