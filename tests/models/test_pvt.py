"""InLine-PVT: golden outputs of the authors' code, state-dict layouts, sizes, ablations, features."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_helpers import assert_close_rel, count_params, load_golden, meta_model, reference_layout, state_layout

from inline_attn import get_model_config, load_checkpoint
from inline_attn.models.pvt import InLinePVT, PVTAttention, SpatialReductionAttention

PVT_MODELS = ["inline_pvt_tiny", "inline_pvt_small", "inline_pvt_medium", "inline_pvt_large"]
PUBLISHED_PARAMS = {
    "inline_pvt_tiny": 12_032_232,
    "inline_pvt_small": 21_556_136,
    "inline_pvt_medium": 37_618_856,
    "inline_pvt_large": 51_154_280,
}

_SAME_NAME = {
    "img_size",
    "patch_size",
    "in_chans",
    "num_classes",
    "embed_dims",
    "num_heads",
    "mlp_ratios",
    "qkv_bias",
    "drop_rate",
    "attn_drop_rate",
    "drop_path_rate",
    "depths",
    "sr_ratios",
}


def pvt_kwargs(ref_kwargs: dict) -> dict:
    """The reference InLinePVT's arguments -> ours.

    attn_type -> pattern; la_sr_ratios must be all 1 (the reference's InLine attention cannot
    run with a reduction); no norm_layer given -> the class default LayerNorm eps 1e-5.
    """
    kw = dict(ref_kwargs)
    assert set(kw.pop("la_sr_ratios", "1111")) == {"1"}, "InLine blocks with spatial reduction"
    kw["pattern"] = kw.pop("attn_type", "IIII")
    kw["norm_eps"] = 1e-5
    unknown = set(kw) - _SAME_NAME - {"pattern", "norm_eps"}
    assert not unknown, f"reference arguments without a mapping: {unknown}"
    return kw


def small(**kw) -> InLinePVT:
    args = dict(
        img_size=64,
        embed_dims=(8, 16, 24, 32),
        num_heads=(1, 2, 3, 4),
        mlp_ratios=(2, 2, 2, 2),
        depths=(1, 1, 1, 1),
        num_classes=5,
    )
    return InLinePVT(**{**args, **kw}).eval()


def test_golden_output_matches_reference(float64):
    meta, data = load_golden("pvt_tiny_cfg")
    model = InLinePVT(**pvt_kwargs(meta["kwargs"])).eval()
    model.load_state_dict(data["model"], strict=True)
    # the golden case mixes both block kinds: InLine stages 1-2, spatial-reduction softmax 3-4
    assert isinstance(model.block1[0].attn, PVTAttention)
    assert isinstance(model.block3[0].attn, SpatialReductionAttention)
    with torch.no_grad():
        out = model(data["input"])
    assert out.shape == tuple(meta["output_shape"])
    assert_close_rel(out, data["output"], rtol=1e-10)


@pytest.mark.parametrize("name", PVT_MODELS)
def test_state_dict_layout_and_params_match_reference(name):
    model = meta_model(name)
    assert state_layout(model) == reference_layout(name)
    assert count_params(model) == PUBLISHED_PARAMS[name] == get_model_config(name).num_params


def test_non_square_input_resizes_each_stage_pos_embed():
    # 224 x 320 scaled down: built for 64 x 64, fed 64 x 96
    model = small()
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        out = model(x)
        wide = small(img_size=(64, 96))
        sd = model.state_dict()
        for i, (side, (h, w)) in enumerate(zip((16, 8, 4, 2), ((16, 24), (8, 12), (4, 6), (2, 3)))):
            grid = sd[f"pos_embed{i + 1}"].reshape(1, side, side, -1).permute(0, 3, 1, 2)
            grid = F.interpolate(grid, size=(h, w), mode="bilinear", align_corners=False)
            sd[f"pos_embed{i + 1}"] = grid.flatten(2).transpose(1, 2)
        wide.load_state_dict(sd)
        ref = wide(x)
    assert out.shape == (2, 5) and torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_stride_indivisible_input_pads_each_stage():
    # 72 x 104: the stem divides it, the later stride-2 embeddings need padding (18x26 -> 9x13 -> 5x7 -> 3x4)
    model = small()
    with torch.no_grad():
        maps = model.forward_intermediates(torch.randn(1, 3, 72, 104), intermediates_only=True)
    assert [tuple(m.shape[2:]) for m in maps] == [(18, 26), (9, 13), (5, 7), (3, 4)]
    assert all(torch.isfinite(m).all() for m in maps)


@pytest.mark.parametrize(
    "pattern,kinds",
    [
        ("IIII", ["inline"] * 4),
        ("SSSS", ["softmax"] * 4),
        ("LLLL", ["linear"] * 4),
        ("ISLS", ["inline", "softmax", "linear", "softmax"]),
    ],
)
def test_patterns(pattern, kinds):
    model = small(pattern=pattern)
    assert [getattr(model, f"block{i + 1}")[0].attn.kind for i in range(4)] == kinds
    keys = model.state_dict().keys()
    # softmax stages 1-3 reduce keys (sr 8-4-2), stage 4 (sr 1) does not; InLine stages have the residual
    for i, kind in enumerate(kinds):
        assert (f"block{i + 1}.0.attn.sr.weight" in keys) == (kind == "softmax" and i < 3)
        assert (f"block{i + 1}.0.attn.residual.0.weight" in keys) == (kind == "inline")
    out = model(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 5) and torch.isfinite(out).all()


def test_mixed_stage_pattern():
    model = small(depths=(1, 1, 3, 1), pattern="IIMSM2")
    assert [blk.attn.kind for blk in model.block3] == ["inline", "inline", "softmax"]


def test_features_only_channels_strides_and_pruning():
    model = small()
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        _, maps = model.forward_intermediates(x)
    backbone = small().to_features_only()
    load_checkpoint(backbone, model.state_dict())
    with torch.no_grad():
        feats = backbone(x)
    assert [f.shape[1] for f in feats] == [i["num_chs"] for i in backbone.feature_info] == [8, 16, 24, 32]
    assert [64 // f.shape[2] for f in feats] == [i["reduction"] for i in backbone.feature_info] == [4, 8, 16, 32]
    for f, m in zip(feats, maps):
        torch.testing.assert_close(f, m, rtol=0, atol=0)

    two = small().to_features_only(out_indices=(0, 1))
    assert two.block3 is None and two.pos_embed3 is None
    assert not any(k.startswith(("block3", "block4", "pos_embed3", "patch_embed4", "head")) for k in two.state_dict())
    assert [f.shape[1] for f in two(x)] == [8, 16]


def test_reset_classifier_and_no_weight_decay():
    model = small()
    model.reset_classifier(3)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 3)
    assert model.no_weight_decay() == {"pos_embed1", "pos_embed2", "pos_embed3", "pos_embed4"}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(pattern="III"), "pattern"),
        (dict(num_heads=(1, 2, 3)), "num_heads"),
        (dict(num_heads=(3, 2, 3, 4)), "num_heads"),
        (dict(global_pool="token"), "global_pool"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        small(**kwargs)


def test_attention_records_cover_both_block_kinds():
    from inline_attn.layers import attention_layers, record_attention

    model = small(pattern="ISIS")
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref = model(x)
        with record_attention(model) as records:
            out = model(x)  # explicit weights @ V instead of the fast paths
    assert len(records) == len(attention_layers(model)) == 4
    # InLine: N x N over the stage grid; spatial reduction: N x (H/sr)(W/sr) keys
    assert [tuple(r.weights.shape) for r in records] == [(2, 1, 256, 256), (2, 2, 64, 4), (2, 3, 16, 16), (2, 4, 4, 4)]
    assert [r.kind for r in records] == ["inline", "softmax", "inline", "softmax"]
    torch.testing.assert_close(records[0].weights.sum(-1), torch.ones(2, 1, 256))  # InLine rows sum to 1
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
