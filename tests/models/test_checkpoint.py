"""load_checkpoint / save_checkpoint: formats, wrappers, filters, mismatches, corrupted files."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from model_helpers import assert_close_rel, load_golden

from inline_attn import create_model, load_checkpoint, save_checkpoint
from inline_attn.models.checkpoint import LoadResult, read_state_dict
from inline_attn.models.deit import InLineDeiT
from inline_attn.models.pvt import InLinePVT


class TrainingConfig:  # stands in for the config object some training checkpoints pickle
    lr = 5e-4


def tiny_deit(**kw) -> InLineDeiT:
    args = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2, num_classes=5)
    return InLineDeiT(**{**args, **kw}).eval()


def outputs(model, x):
    with torch.no_grad():
        return model(x)


def test_safetensors_round_trip_is_exact_and_atomic(tmp_path):
    src, dst = tiny_deit(), tiny_deit()
    x = torch.randn(2, 3, 32, 32)
    path = save_checkpoint(src, tmp_path / "sub" / "m.safetensors")
    assert path.exists() and os.listdir(path.parent) == ["m.safetensors"]  # no temp file left
    assert not torch.equal(outputs(src, x), outputs(dst, x))
    result = load_checkpoint(dst, path)
    assert isinstance(result, LoadResult) and result.ok
    torch.testing.assert_close(outputs(dst, x), outputs(src, x), rtol=0, atol=0)


@pytest.mark.parametrize("wrapper", [None, "model", "state_dict", "model_ema", "ddp"])
def test_authors_pth_wrappers(tmp_path, wrapper):
    src, dst = tiny_deit(), tiny_deit()
    sd = src.state_dict()
    if wrapper == "ddp":
        obj = {"model": {f"module.{k}": v for k, v in sd.items()}}
    else:
        obj = sd if wrapper is None else {wrapper: sd, "epoch": 300, "max_accuracy": 74.5}
    torch.save(obj, tmp_path / "ckpt.pth")
    load_checkpoint(dst, tmp_path / "ckpt.pth")
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(outputs(dst, x), outputs(src, x), rtol=0, atol=0)


def test_golden_weights_as_authors_pth_reproduce_reference_output(tmp_path, float64):
    # the golden state dict saved as the authors release it ({"model": sd}); PVT case
    meta, data = load_golden("pvt_tiny_cfg")
    torch.save({"model": data["model"]}, tmp_path / "inline_pvt.pth")
    kw = dict(meta["kwargs"])
    assert kw.pop("la_sr_ratios") == "1111"
    kw["pattern"] = kw.pop("attn_type")
    model = InLinePVT(**kw, norm_eps=1e-5).eval()
    load_checkpoint(model, tmp_path / "inline_pvt.pth")
    assert_close_rel(outputs(model, data["input"]), data["output"], rtol=1e-10)


def test_bare_mapping_and_create_model_checkpoint_path(tmp_path):
    overrides = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2, num_classes=5)
    src = create_model("inline_deit_tiny", **overrides).eval()
    dst = create_model("inline_deit_tiny", **overrides).eval()
    load_checkpoint(dst, src.state_dict())
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(outputs(dst, x), outputs(src, x), rtol=0, atol=0)
    save_checkpoint(src, tmp_path / "m.safetensors")
    again = create_model("inline_deit_tiny", checkpoint_path=str(tmp_path / "m.safetensors"), **overrides).eval()
    torch.testing.assert_close(outputs(again, x), outputs(src, x), rtol=0, atol=0)


def test_meta_model_takes_the_file_tensors():
    src = tiny_deit()
    with torch.device("meta"):
        dst = tiny_deit()
    load_checkpoint(dst, src.state_dict())
    assert not any(p.is_meta for p in dst.parameters())
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(outputs(dst, x), outputs(src, x), rtol=0, atol=0)


def test_mismatch_lists_missing_unexpected_and_wrong_shapes():
    sd = tiny_deit(num_classes=9).state_dict()  # head of another shape
    del sd["blocks.1.mlp.fc2.bias"]
    sd["blocks.7.attn.qkv.weight"] = torch.zeros(3)
    with pytest.raises(ValueError) as err:
        load_checkpoint(tiny_deit(), sd)
    msg = str(err.value)
    assert "missing keys (1): blocks.1.mlp.fc2.bias" in msg
    assert "unexpected keys (1): blocks.7.attn.qkv.weight" in msg
    assert "head.weight (file [9, 24] vs model [5, 24])" in msg and "head.bias" in msg


def test_non_strict_loads_what_fits_and_reports_the_rest():
    src, dst = tiny_deit(num_classes=9), tiny_deit()
    result = load_checkpoint(dst, src.state_dict(), strict=False)
    assert [k for k, *_ in result.mismatched] == ["head.weight", "head.bias"]
    assert not result.missing and not result.unexpected
    torch.testing.assert_close(dst.blocks[0].attn.qkv.weight, src.blocks[0].attn.qkv.weight, rtol=0, atol=0)


def test_recomputed_buffers_are_ignored():
    src, dst = tiny_deit(), tiny_deit()
    sd = dict(src.state_dict())
    sd["blocks.0.attn.attn_mask"] = torch.zeros(4, 16, 16)
    sd["blocks.0.attn.relative_position_index"] = torch.zeros(16, 16, dtype=torch.long)
    result = load_checkpoint(dst, sd)
    assert sorted(result.ignored) == ["blocks.0.attn.attn_mask", "blocks.0.attn.relative_position_index"]


def test_pos_embed_of_another_size_is_resized():
    src, dst = tiny_deit(), tiny_deit(img_size=48)  # grid 4x4 -> 6x6
    load_checkpoint(dst, src.state_dict())
    grid = src.pos_embed[:, 1:].reshape(1, 4, 4, -1).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=(6, 6), mode="bilinear", align_corners=False).flatten(2).transpose(1, 2)
    torch.testing.assert_close(dst.pos_embed[:, 1:], grid, rtol=0, atol=0)
    torch.testing.assert_close(dst.pos_embed[:, :1], src.pos_embed[:, :1], rtol=0, atol=0)


def test_full_checkpoint_loads_into_features_only_backbone():
    src = tiny_deit(depth=3)
    backbone = tiny_deit(depth=3).to_features_only(out_indices=(1,))
    assert backbone.pruned_modules == ("blocks.2", "norm", "head")
    load_checkpoint(backbone, src.state_dict())  # strict: pruned norm/head/block 2 entries dropped
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        ref = src.forward_intermediates(x, indices=[1], intermediates_only=True)
    torch.testing.assert_close(outputs(backbone, x)[0], ref[0], rtol=0, atol=0)
    # and the backbone's own (pruned) state dict loads back into a backbone
    again = tiny_deit(depth=3).to_features_only(out_indices=(1,))
    assert load_checkpoint(again, backbone.state_dict()).ok
    torch.testing.assert_close(outputs(again, x)[0], ref[0], rtol=0, atol=0)

    args = dict(img_size=64, embed_dims=(8, 16, 24, 32), num_heads=(1, 2, 3, 4), depths=(1, 1, 1, 1))
    pvt = InLinePVT(**args, num_classes=5)
    two = InLinePVT(**args).to_features_only(out_indices=(0, 1))
    assert load_checkpoint(two, pvt.state_dict()).ok
    # a pruned entry of another shape is dropped, not reported: it belongs to no kept module
    sd = dict(pvt.state_dict(), **{"pos_embed3": torch.zeros(1, 4, 24)})
    assert load_checkpoint(two, sd).ok


def test_create_model_loads_the_full_model_then_prunes(tmp_path):
    overrides = dict(img_size=32, patch_size=8, embed_dim=24, depth=3, num_heads=2, num_classes=5)
    src = create_model("inline_deit_tiny", **overrides).eval()
    path = save_checkpoint(src, tmp_path / "full.safetensors")
    backbone = create_model(
        "inline_deit_tiny", checkpoint_path=str(path), features_only=True, out_indices=(0, 1), **overrides
    ).eval()
    assert len(backbone.blocks) == 2 and backbone.out_indices == (0, 1)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = src.forward_intermediates(x, indices=(0, 1), intermediates_only=True)
        for got, want in zip(backbone(x), ref):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 6, bias=False)
        self.out = nn.Linear(4, 6, bias=False)
        self.out.weight = self.embed.weight  # tied


def test_tied_tensors_save_and_load(tmp_path):
    src, dst = Tied(), Tied()
    save_checkpoint(src, tmp_path / "tied.safetensors")
    load_checkpoint(dst, tmp_path / "tied.safetensors")
    assert dst.out.weight is dst.embed.weight
    torch.testing.assert_close(dst.embed.weight, src.embed.weight, rtol=0, atol=0)


def test_class_filter_maps_foreign_keys():
    class Renamed(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

        @staticmethod
        def checkpoint_filter_fn(state_dict, model):
            if "fc.weight" in state_dict:  # already ours
                return state_dict
            return {k.replace("dense.", "fc."): v for k, v in state_dict.items()}

    model = Renamed()
    load_checkpoint(model, {"dense.weight": torch.ones(2, 2), "dense.bias": torch.zeros(2)})
    torch.testing.assert_close(model.fc.weight, torch.ones(2, 2))
    load_checkpoint(model, {"fc.weight": torch.zeros(2, 2), "fc.bias": torch.zeros(2)})
    torch.testing.assert_close(model.fc.weight, torch.zeros(2, 2))


def test_corrupted_and_foreign_files_raise_clear_errors(tmp_path):
    model = tiny_deit()
    good = save_checkpoint(model, tmp_path / "good.safetensors")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match="cannot read checkpoint .*truncated.safetensors"):
        load_checkpoint(model, truncated)
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(os.urandom(256))
    with pytest.raises(ValueError, match="cannot read checkpoint .*garbage.pth"):
        load_checkpoint(model, garbage)
    with pytest.raises(ValueError, match="does not exist"):
        load_checkpoint(model, tmp_path / "nope.pth")
    with pytest.raises(ValueError, match=f"checkpoint file '{tmp_path}' is a folder: give the file in it"):
        load_checkpoint(model, tmp_path)
    torch.save([1, 2, 3], tmp_path / "list.pth")
    with pytest.raises(ValueError, match="holds a list"):
        load_checkpoint(model, tmp_path / "list.pth")
    torch.save({"optimizer": {"lr": torch.ones(1)}}, tmp_path / "opt.pth")
    with pytest.raises(ValueError, match="neither a state dict"):
        load_checkpoint(model, tmp_path / "opt.pth")


def test_pickled_objects_need_weights_only_false(tmp_path):
    src = tiny_deit()
    torch.save({"model": src.state_dict(), "config": TrainingConfig()}, tmp_path / "with_config.pth")
    with pytest.raises(ValueError, match="weights_only=False"):
        read_state_dict(tmp_path / "with_config.pth")
    dst = tiny_deit()
    load_checkpoint(dst, tmp_path / "with_config.pth", weights_only=False)
    torch.testing.assert_close(dst.head.weight, src.head.weight, rtol=0, atol=0)
