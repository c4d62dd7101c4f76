"""Registry-wide suite: every registered model, at its family's small overrides (conftest.py).

Published-size facts (every name builds, parameter counts, state-dict layouts) are checked on
the meta device, so they cost no memory and no init time.
"""
from __future__ import annotations

import pytest
import torch
from model_helpers import LAYOUT_DIR, count_params, meta_model, reference_layout, state_layout

from inline_attn import create_model, get_model_config, list_models
from inline_attn.cli import main


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
    assert count_params(model) == cfg.num_params, f"{registry_name}: params differ from the SPEC table"
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
