"""InLine-DeiT: golden outputs of the authors' code, state-dict layouts, sizes, ablations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_helpers import assert_close_rel, count_params, load_golden, meta_model, reference_layout, state_layout

from inline_attn import create_model, get_model_config, load_checkpoint
from inline_attn.models.deit import InLineDeiT

DEIT_MODELS = ["inline_deit_tiny", "inline_deit_small", "inline_deit_base"]
PUBLISHED_PARAMS = {"inline_deit_tiny": 6_477_736, "inline_deit_small": 16_734_760, "inline_deit_base": 23_797_096}

# the reference InLineDeiT's arguments that exist here under the same name
_SAME_NAME = {
    "img_size",
    "patch_size",
    "in_chans",
    "num_classes",
    "embed_dim",
    "depth",
    "num_heads",
    "mlp_ratio",
    "qkv_bias",
    "drop_rate",
    "attn_drop_rate",
    "drop_path_rate",
}


def deit_kwargs(ref_kwargs: dict) -> dict:
    """The reference's constructor arguments -> ours (the reference is all-InLine)."""
    unknown = set(ref_kwargs) - _SAME_NAME
    assert not unknown, f"reference arguments without a mapping: {unknown}"
    return dict(ref_kwargs, pattern="I")


def small(**kw) -> InLineDeiT:
    args = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2, num_classes=5)
    return InLineDeiT(**{**args, **kw}).eval()


def test_golden_output_matches_reference(float64):
    meta, data = load_golden("deit_tiny_cfg")
    model = InLineDeiT(**deit_kwargs(meta["kwargs"])).eval()
    model.load_state_dict(data["model"], strict=True)
    with torch.no_grad():
        out = model(data["input"])
    assert out.dtype == torch.float64 and out.shape == tuple(meta["output_shape"])
    assert_close_rel(out, data["output"], rtol=1e-10)


@pytest.mark.parametrize("name", DEIT_MODELS)
def test_state_dict_layout_and_params_match_reference(name):
    model = meta_model(name)
    assert state_layout(model) == reference_layout(name)
    assert count_params(model) == PUBLISHED_PARAMS[name] == get_model_config(name).num_params


def test_plain_deit_tiny_is_one_override_away():
    # softmax attention, 3 heads, no residual predictor: DeiT-Ti's published 5,717,416 parameters
    model = meta_model("inline_deit_tiny", pattern="S", num_heads=3)
    assert count_params(model) == 5_717_416
    assert not any(".residual." in k for k in model.state_dict())


def test_non_square_input_resizes_pos_embed_bilinearly():
    # 224 x 320 scaled down: built for 32 x 32, fed 32 x 48 (grid 4 x 6)
    model = small()
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        out = model(x)
        # the same weights in a model built for 32 x 48, position embedding resized by hand
        wide = small(img_size=(32, 48))
        sd = model.state_dict()
        grid = sd["pos_embed"][:, 1:].reshape(1, 4, 4, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(4, 6), mode="bilinear", align_corners=False)
        sd["pos_embed"] = torch.cat([sd["pos_embed"][:, :1], grid.flatten(2).transpose(1, 2)], dim=1)
        wide.load_state_dict(sd)
        ref = wide(x)
    assert out.shape == (2, 5) and torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_patch_indivisible_input_is_zero_padded():
    model = small()
    x = torch.randn(1, 3, 36, 44)
    with torch.no_grad():
        out = model(x)
        ref = model(F.pad(x, (0, 4, 0, 4)))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_fashion_mnist_overrides():
    model = create_model(
        "inline_deit_tiny",
        img_size=28,
        patch_size=4,
        in_chans=1,
        num_classes=10,
        embed_dim=32,
        depth=2,
        num_heads=2,
        drop_path_rate=0.0,
    )
    out = model(torch.randn(3, 1, 28, 28))
    assert out.shape == (3, 10)
    assert model.pos_embed.shape == (1, 1 + 7 * 7, 32)


@pytest.mark.parametrize(
    "pattern,feature_map,residual,expect_residual",
    [
        ("I", None, None, True),
        ("I", "relu", False, False),
        ("I", "exp", None, True),
        ("I", "affine_relu", None, True),
        ("L", None, None, False),
        ("L", "leakyrelu", True, True),
        ("S", None, None, False),
    ],
)
def test_ablations_build_and_run(pattern, feature_map, residual, expect_residual):
    model = small(pattern=pattern, feature_map=feature_map, local_residual=residual)
    kinds = {blk.attn.kind for blk in model.blocks}
    assert kinds == {dict(I="inline", L="linear", S="softmax")[pattern]}
    assert (model.blocks[0].attn.residual is not None) == expect_residual
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 5) and torch.isfinite(out).all()


def test_global_avg_pool_and_pre_logits():
    model = small(global_pool="avg")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = model.forward_features(x)
        pooled = model.forward_head(tokens, pre_logits=True)
    torch.testing.assert_close(pooled, tokens[:, 1:].mean(1))


def test_features_only_and_intermediates():
    model = small(depth=3)
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        last2 = model.forward_intermediates(x, indices=2, intermediates_only=True)
    assert len(maps) == 3 and all(m.shape == (2, 24, 4, 6) for m in maps)
    torch.testing.assert_close(last2[1], maps[2])
    assert final.shape == (2, 1 + 24, 24)

    backbone = small(depth=3).to_features_only(out_indices=(0, 2))
    assert len(backbone.blocks) == 3 and backbone.pruned_modules == ("norm", "head")
    load_checkpoint(backbone, model.state_dict())
    with torch.no_grad():
        feats = backbone(x)
    assert [f.shape[1] for f in feats] == [i["num_chs"] for i in backbone.feature_info] == [24, 24]
    assert [i["reduction"] for i in backbone.feature_info] == [8, 8]
    torch.testing.assert_close(feats[1], maps[2])


@pytest.mark.parametrize("pool", ["token", "avg"])
def test_last_block_residual_reaches_the_logits_only_through_patch_tokens(pool):
    # as in the reference: the residual acts on patch tokens only, so with the cls-token head the
    # last block's residual predictor cannot influence the logits (zero gradient); with avg pool it can
    model = small(global_pool=pool).train()
    model(torch.randn(2, 3, 32, 32)).square().sum().backward()
    grad = model.blocks[-1].attn.residual[2].weight.grad
    assert (grad.abs().sum() > 0) == (pool == "avg")
    assert model.blocks[0].attn.residual[2].weight.grad.abs().sum() > 0


def test_reset_classifier_and_no_weight_decay():
    model = small()
    model.reset_classifier(3)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 3)
    model.reset_classifier(0)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 24)
    assert model.no_weight_decay() == {"pos_embed", "cls_token"}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(pattern="X"), "pattern"),
        (dict(pattern="II"), "pattern"),
        (dict(global_pool="max"), "global_pool"),
        (dict(num_heads=5), "num_heads"),
        (dict(img_size=4), "img_size"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        small(**kwargs)


def test_wrong_input_channels_raise():
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        small()(torch.randn(1, 1, 32, 32))
