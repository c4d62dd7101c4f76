"""Registry-wide suite: every registered model, at its family's small overrides (conftest.py).

Published-size facts (every name builds, parameter counts, state-dict layouts) are checked on
the meta device, so they cost no memory and no init time.
"""

from __future__ import annotations

import pytest
import torch
from model_helpers import LAYOUT_DIR, count_params, meta_model, reference_layout, state_layout

from inline_attn import create_model, get_model_config, list_models, load_checkpoint, save_checkpoint
from inline_attn.cli import main
from inline_attn.models import InLineModel


def build(name: str, overrides: dict, **extra):
    """(model, input size (H, W)) from the family's small overrides."""
    size = overrides["img_size"]
    hw = (size, size) if isinstance(size, int) else tuple(size)
    kw = {**overrides, "drop_path_rate": 0.0, **extra}
    return create_model(name, **kw), hw


def test_registry_lists_the_published_models():
    names = list_models()
    for family, count in (("deit", 3), ("pvt", 4)):
        assert len(list_models(f"inline_{family}_*")) == count
    assert names == sorted(names)
    with pytest.raises(ValueError, match="unknown model"):
        create_model("inline_deit_tinny")


def test_published_build_params_and_layout(registry_name):
    cfg = get_model_config(registry_name)
    model = meta_model(registry_name)
    assert model.pretrained_cfg is cfg
    assert count_params(model) == cfg.num_params, f"{registry_name}: params differ from the published count"
    if (LAYOUT_DIR / f"{registry_name}.json").exists():
        assert state_layout(model) == reference_layout(registry_name)


def test_forward_shape_finite_and_contract(registry_name, small_overrides):
    model, (h, w) = build(registry_name, small_overrides)
    model.eval()
    classes = small_overrides["num_classes"]
    x = torch.randn(2, 3, h, w)
    with torch.no_grad():
        out = model(x)
        pooled = model.forward_head(model.forward_features(x), pre_logits=True)
    assert out.shape == (2, classes) and torch.isfinite(out).all()
    assert pooled.shape == (2, model.num_features)
    names = {n for n, _ in model.named_parameters()}
    assert model.no_weight_decay() <= names | {n.rsplit(".", 1)[0] for n in names}
    model.reset_classifier(3)
    with torch.no_grad():
        assert model(x).shape == (2, 3)


def test_every_parameter_gets_a_gradient(registry_name, small_overrides):
    model, (h, w) = build(registry_name, small_overrides)
    model.train()
    feats = model.forward_features(torch.randn(2, 3, h, w))
    out = model.forward_head(feats)
    # a loss on the logits and on every output token: with a cls-token head, the last block's
    # local residual (patch tokens only) cannot reach the logits (see test_deit.py)
    ((out * torch.randn_like(out)).sum() + (feats * torch.randn_like(feats)).sum()).backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not no_grad, f"parameters without a gradient: {no_grad}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_grad_checkpointing_leaves_outputs_and_grads_unchanged(registry_name, small_overrides):
    model, (h, w) = build(registry_name, small_overrides)
    model.train()  # dropout and drop path are 0: training mode is deterministic here
    x = torch.randn(2, 3, h, w)

    def run():
        model.zero_grad()
        out = model(x)
        out.square().sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    out_ref, grads_ref = run()
    model.set_grad_checkpointing(True)
    out_ckpt, grads_ckpt = run()
    torch.testing.assert_close(out_ckpt, out_ref, rtol=0, atol=0)
    for n, g in grads_ref.items():
        torch.testing.assert_close(grads_ckpt[n], g, rtol=1e-6, atol=1e-7, msg=lambda m, n=n: f"{n}: {m}")


def test_features_match_feature_info(registry_name, small_overrides):
    model, (h, w) = build(registry_name, small_overrides, features_only=True)
    model.eval()
    with torch.no_grad():
        feats = model(torch.randn(2, 3, h, w))
    assert isinstance(feats, list) and len(feats) == len(model.feature_info) > 0
    for f, info in zip(feats, model.feature_info):
        assert f.dim() == 4 and f.shape[:2] == (2, info["num_chs"])
        assert (h // f.shape[2], w // f.shape[3]) == (info["reduction"], info["reduction"])


def test_non_square_and_stride_indivisible_inputs(registry_name, small_overrides):
    model, (h, w) = build(registry_name, small_overrides, features_only=True)
    model.eval()
    stem, total = model.feature_info[0]["reduction"], model.feature_info[-1]["reduction"]
    # 224 x 320-like (wider than tall), then sides the stem divides but the deepest stride does not
    for hh, ww in ((h, w + 2 * total), (h + stem, w + 3 * stem)):
        with torch.no_grad():
            feats = model(torch.randn(1, 3, hh, ww))
        for f, info in zip(feats, model.feature_info):
            r = info["reduction"]
            assert tuple(f.shape[2:]) == (-(-hh // r), -(-ww // r)), f"input {hh}x{ww}, stride {r}"
            assert torch.isfinite(f).all()


def test_cli_list(capsys):
    assert main(["list", "inline_pvt_*"]) == 0
    assert capsys.readouterr().out.split() == list_models("inline_pvt_*")
    assert main(["list", "-v"]) == 0
    assert "6,477,736" in capsys.readouterr().out
    assert main(["list", "nothing_*"]) == 2


# ---- the timm contract, held once for every family (models/_base.py)

CONTRACT = (
    "forward_features",
    "forward_head",
    "forward_intermediates",
    "prune_intermediate_layers",
    "to_features_only",
    "reset_classifier",
    "get_classifier",
    "set_grad_checkpointing",
    "no_weight_decay",
    "checkpointed",
)


def test_contract_is_written_once(registry_name):
    model = meta_model(registry_name)
    assert isinstance(model, InLineModel)
    overridden = [m for m in CONTRACT if getattr(type(model), m) is not getattr(InLineModel, m)]
    assert not overridden, f"{type(model).__name__} overrides the shared contract: {overridden}"
    # forward is the family's own one-line frame (one torch.compile state per class) over _forward
    assert type(model).forward.__code__.co_names == ("_forward",)
    assert len(model.feature_info) == model.num_levels > 0 and model.features_only is False
    assert model.get_classifier() is model.head


def test_a_family_without_its_own_forward_is_refused():
    with pytest.raises(TypeError, match="must define forward"):
        type("NoForward", (InLineModel,), {})


def test_intermediates_options(registry_name, small_overrides):
    model, (h, w) = build(registry_name, small_overrides)
    model.eval()
    x = torch.randn(2, 3, h, w + model.feature_info[-1]["reduction"])  # non-square
    n = model.num_levels
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        torch.testing.assert_close(final, model.forward_features(x), rtol=0, atol=0)
        assert len(maps) == n
        for m, info in zip(maps, model.feature_info):
            assert m.dim() == 4 and m.shape[1] == info["num_chs"] and m.is_contiguous()
        last2 = model.forward_intermediates(x, indices=2, intermediates_only=True)
        picked = model.forward_intermediates(x, indices=[0, -1], intermediates_only=True)
        nhwc = model.forward_intermediates(x, indices=[-1], output_fmt="NHWC", intermediates_only=True)
        early_final, early = model.forward_intermediates(x, indices=[0], stop_early=True)
        normed = model.forward_intermediates(x, indices=[-1], norm=True, intermediates_only=True)
    for a, b in zip(last2 + picked, maps[-2:] + [maps[0], maps[-1]]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(nhwc[0], maps[-1].permute(0, 2, 3, 1), rtol=0, atol=0)
    torch.testing.assert_close(early[0], maps[0], rtol=0, atol=0)
    assert early_final.shape[0] == 2
    # norm=True normalises the last level wherever the family has a final norm (PVT has none)
    assert torch.equal(normed[0], maps[-1]) == isinstance(model.norm, torch.nn.Identity)
    with pytest.raises(ValueError, match="output_fmt='NLC'"):
        model.forward_intermediates(x, output_fmt="NLC")
    with pytest.raises(ValueError, match=f"indices={n + 1}"):
        model.forward_intermediates(x, indices=n + 1)
    with pytest.raises(ValueError, match=rf"indices=\[0, {-n}\]: level 0 is given twice; give each level once"):
        model.forward_intermediates(x, indices=[0, -n])  # one level twice: fewer maps than asked for


def test_a_backbone_refuses_an_output_level_given_twice():
    with pytest.raises(ValueError, match=r"indices=\(1, 1\): level 1 is given twice"):
        with torch.device("meta"):
            create_model("inline_pvt_tiny", features_only=True, out_indices=(1, 1))


def test_prune_intermediate_layers(registry_name, small_overrides):
    model, (h, w) = build(registry_name, small_overrides)
    model.eval()
    x = torch.randn(1, 3, h, w)
    with torch.no_grad():
        ref = model.forward_intermediates(x, intermediates_only=True)
    full_keys = set(model.state_dict())
    assert model.prune_intermediate_layers(indices=[0], prune_norm=True) == [0]
    assert model.num_levels == 1 and len(model.feature_info) == 1 and model.num_classes == 0
    kept = set(model.state_dict())
    assert kept < full_keys and not any(k.startswith(("head.", "norm.")) for k in kept)
    assert all(any(k == p or k.startswith(p + ".") for p in model.pruned_modules) for k in full_keys - kept)
    names = {n for n, _ in model.named_parameters()}
    assert model.no_weight_decay() <= names
    with torch.no_grad():
        torch.testing.assert_close(model.forward_intermediates(x, intermediates_only=True)[0], ref[0], rtol=0, atol=0)
        assert model(x).shape[0] == 1  # pooled features of the kept level, no head
    with pytest.raises(ValueError, match="indices"):
        model.forward_intermediates(x, indices=[1])


def test_features_only_default_is_every_level_and_loads_the_full_checkpoint(registry_name, small_overrides, tmp_path):
    src, (h, w) = build(registry_name, small_overrides)
    src.eval()
    path = save_checkpoint(src, tmp_path / "full.safetensors")
    backbone, _ = build(registry_name, small_overrides, features_only=True, checkpoint_path=str(path))
    backbone.eval()
    assert backbone.out_indices == tuple(range(src.num_levels)) and backbone.feature_info == src.feature_info
    last, _ = build(registry_name, small_overrides, features_only=True, out_indices=1)
    assert last.out_indices == (src.num_levels - 1,) and last.feature_info == src.feature_info[-1:]
    assert load_checkpoint(last, src.state_dict()).ok  # a full checkpoint into a pruned backbone
    x = torch.randn(2, 3, h, w)
    with torch.no_grad():
        ref = src.forward_intermediates(x, intermediates_only=True)
        for got, want in zip(backbone(x) + last(x), ref + ref[-1:]):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="no classifier"):
        backbone.reset_classifier(3)
    with pytest.raises(ValueError, match="pass features_only=True"):
        create_model(registry_name, **{**small_overrides, "out_indices": (0,)})


def test_reset_classifier_keeps_device_and_dtype_and_validates(registry_name, small_overrides):
    model, _ = build(registry_name, small_overrides)
    model.double()
    model.reset_classifier(4)
    head = model.get_classifier()
    assert head.weight.dtype == torch.float64 and head.weight.device.type == "cpu"
    assert head.weight.shape == (4, model.num_features) and model.num_classes == 4
    assert torch.count_nonzero(head.bias) == 0 and 0 < head.weight.std() < 0.05  # the model's own init
    for bad in (-1, 2.0, True, "3"):
        with pytest.raises(ValueError, match=f"num_classes={bad!r}"):
            model.reset_classifier(bad)
    with pytest.raises(ValueError, match="global_pool='max'"):
        model.reset_classifier(3, global_pool="max")
    model.reset_classifier(0, global_pool=model.global_pools[-1])
    assert isinstance(model.get_classifier(), torch.nn.Identity) and model.global_pool == model.global_pools[-1]
