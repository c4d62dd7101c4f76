"""docs/adoption.md's entries against the real timm and torchvision, where they import.

They do not import beside the CPU build of torch that `make test` installs (torchvision's C ops
need libtorch_cuda), so here the stand-ins of test_convert.py / test_timm_contract.py hold the
contract; this file runs on a GPU machine (which has timm) and in any environment where both import.
"""

from __future__ import annotations

import pytest
import torch

timm = pytest.importorskip("timm", reason="timm does not import here (it needs torchvision's CUDA build)")
torchvision = pytest.importorskip("torchvision")

import inline_attn  # noqa: E402
from inline_attn.models import timm_registry  # noqa: E402, F401  (registers our models with timm)


def _converted_runs(model: torch.nn.Module, size: int) -> int:
    before = {k: v.clone() for k, v in model.state_dict().items()}
    table = inline_attn.convert(model)
    for k, v in model.state_dict().items():
        if k in before:
            assert torch.equal(before[k], v), k
    model(torch.randn(2, 3, size, size)).sum().backward()
    return len(table)


@pytest.mark.parametrize(
    "name, size",
    [("vit_tiny_patch16_224", 64), ("deit_tiny_distilled_patch16_224", 64), ("swin_tiny_patch4_window7_224", 224)],
)
def test_timm_models_convert_and_train(name, size):
    kwargs = {} if "swin" in name else {"img_size": size}
    assert _converted_runs(timm.create_model(name, pretrained=False, **kwargs), size) == 12


def test_torchvision_vit_converts_and_trains():
    vit = torchvision.models.VisionTransformer(
        image_size=64, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128
    )
    assert _converted_runs(vit, 64) == 2


def test_rotary_attention_is_refused_by_name():
    with pytest.raises(ValueError, match="rope"):
        inline_attn.convert(timm.create_model("eva02_tiny_patch14_224", pretrained=False))


def test_eva_without_rope_converts_and_trains():
    from timm.models.eva import Eva

    eva = Eva(img_size=64, patch_size=16, embed_dim=64, depth=2, num_heads=4, num_classes=10)
    assert eva.rope is None
    assert _converted_runs(eva, 64) == 2
    assert type(eva.blocks[0].attn).__name__ == "InLineEvaAttention"


def test_eva_with_rope_is_refused_naming_rope():
    from timm.models.eva import Eva

    eva = Eva(img_size=64, patch_size=16, embed_dim=64, depth=2, num_heads=4, num_classes=10, use_rot_pos_emb=True)
    with pytest.raises(ValueError, match=r"rotary embeddings \(rope\)"):
        inline_attn.convert(eva)


def test_timm_builds_ours_with_its_contract():
    model = timm.create_model("inline_swin_tiny", pretrained=False, features_only=True)
    assert model.feature_info.channels() == [96, 192, 384, 768]
    assert model.feature_info.reduction() == [4, 8, 16, 32]
    deit = timm.create_model("inline_deit_tiny", pretrained=False, pretrained_cfg_overlay=dict(crop_pct=1.0))
    from timm.data import resolve_model_data_config

    assert resolve_model_data_config(deit)["crop_pct"] == 1.0
    from timm.optim import create_optimizer_v2

    groups = create_optimizer_v2(deit, "adamw", lr=1e-3, layer_decay=0.75).param_groups
    assert len({g["lr_scale"] for g in groups}) == len(deit.blocks) + 2  # stem, each block, head


def test_folders_round_trip_both_ways(tmp_path):
    ours = inline_attn.create_model("inline_deit_tiny", depth=2, num_classes=10).eval()
    inline_attn.save_pretrained(ours, tmp_path / "ours")
    x = torch.randn(1, 3, 224, 224)
    by_timm = timm.create_model(f"local-dir:{tmp_path / 'ours'}", pretrained=True).eval()
    assert torch.equal(by_timm(x), ours(x))
    from timm.models._hub import save_for_hf

    # timm's layout: a torch pickle, classifier settings at the top, and the arguments the model was
    # built with only where the caller passes them (without them timm itself rebuilds the default depth)
    save_for_hf(by_timm, tmp_path / "timm", model_args=dict(depth=2))
    assert torch.equal(inline_attn.from_pretrained(tmp_path / "timm")(x), ours(x))
