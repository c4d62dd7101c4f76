"""timm's contract where timm cannot import: its data-config resolution (``.get`` on pretrained_cfg),
``group_matcher`` with its grouping rules, ``FeatureInfo``'s methods, registration and
``local-dir:`` loading, through stand-ins that follow timm's code; the model card, the reader of
timm-written folders and the Hub round trip through a stand-in ``huggingface_hub``."""

from __future__ import annotations

import json
import re
import sys
import types

import pytest
import torch

import inline_attn
from inline_attn.models.checkpoint import read_state_dict
from inline_attn.models.timm_contract import AFTER_BLOCKS, layer_ids
from inline_attn.models.timm_registry import entrypoint, register_all
from inline_attn.runtime.optim import build_optimizer, set_lr

SMALL = {"inline_deit_tiny": dict(depth=2), "inline_swin_tiny": dict(depths=(1, 1, 2, 1), embed_dim=48)}


def resolve_data_config_standin(model) -> dict:
    """timm's resolve_model_data_config on a model without args: the pretrained_cfg (or default_cfg)
    read with ``.get``, timm's defaults where a key is absent."""
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", {})
    out = {"input_size": cfg.get("input_size", None) or (3, 224, 224)}
    out["interpolation"] = cfg.get("interpolation", None) or "bicubic"
    out["mean"] = cfg.get("mean", None) or (0.485, 0.456, 0.406)
    out["std"] = cfg.get("std", None) or (0.229, 0.224, 0.225)
    out["crop_pct"] = cfg.get("crop_pct", None) or 0.875
    return out


def group_standin(names, matcher) -> dict:
    """timm's group_with_matcher(reverse=False) on parameter names: (ordinal, *groups, *suffix), the
    first matching spec wins, MATCH_PREV_GROUP joins the previous group; -> name: layer index."""
    specs = []
    for ordinal, spec in enumerate(matcher.values()):
        items = spec if isinstance(spec, (list, tuple)) else [(spec, None)]
        specs += [(re.compile(p), (ordinal,), suffix) for p, suffix in items]
    keys = {}
    for name in names:
        key = (float("inf"),)
        for pattern, prefix, suffix in specs:
            m = pattern.match(name)
            if m:
                key = tuple(float(x) for part in (prefix, m.groups(), suffix) if part for x in part)
                break
        keys[name] = key
    layer, last, ids = -1, None, {}
    for key in sorted(set(keys.values())):
        if key[-1] != AFTER_BLOCKS or last is None:
            layer += 1
        last = key
        ids[key] = layer
    return {name: ids[k] for name, k in keys.items()}


@pytest.mark.parametrize("name", list(SMALL))
def test_data_config_and_feature_info_read_as_timm_reads_them(name):
    model = inline_attn.create_model(name, **SMALL[name])
    assert resolve_data_config_standin(model)["input_size"] == (3, 224, 224)
    assert model.default_cfg is model.pretrained_cfg and model.pretrained_cfg["architecture"] == name
    assert dict(model.pretrained_cfg.items())["mean"] == (0.485, 0.456, 0.406)
    info = model.feature_info
    assert info.channels() == [f["num_chs"] for f in info] and info.reduction(-1) == info[-1]["reduction"]
    assert info.module_name(0) == info[0]["module"] and info.get_dicts(keys=["num_chs"], idx=0) == {
        "num_chs": info[0]["num_chs"]
    }
    features = inline_attn.create_model(name, features_only=True, out_indices=(-2, -1), **SMALL[name])
    assert features.feature_info.channels() == info.channels()[-2:]


@pytest.mark.parametrize("name", list(SMALL))
def test_group_matcher_orders_stem_blocks_norm_head_as_timm_groups_them(name):
    model = inline_attn.create_model(name, **SMALL[name])
    names = [n for n, _ in model.named_parameters()]
    ours = layer_ids(model)
    assert group_standin(names, model.group_matcher()) == ours
    assert ours["patch_embed.proj.weight"] == 0 and ours["head.weight"] == max(ours.values())
    blocks = sorted({v for n, v in ours.items() if n.startswith(("blocks.", "layers."))})
    assert blocks == list(range(1, max(ours.values())))  # every block its own layer, in order
    assert ours["norm.weight"] == max(ours[n] for n in names if n.startswith(("blocks.", "layers.")))
    coarse = group_standin(names, model.group_matcher(coarse=True))
    assert max(coarse.values()) == model.num_levels + 1  # stem, one per level, head


def test_layer_decay_scales_the_lr_of_each_layer():
    model = inline_attn.create_model("inline_deit_tiny", depth=2)
    ids = layer_ids(model)
    opt = build_optimizer(model, "adamw", 1e-3, 0.05, layer_decay=(0.5, ids))
    top = max(ids.values())
    by_param = {id(p): g for g in opt.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        assert by_param[id(p)]["lr"] == pytest.approx(1e-3 * 0.5 ** (top - ids[name])), name
    set_lr(opt, 2e-3)
    assert by_param[id(model.head.weight)]["lr"] == pytest.approx(2e-3)
    assert by_param[id(model.patch_embed.proj.weight)]["lr"] == pytest.approx(2e-3 * 0.5**top)


def test_registered_entrypoints_build_and_read_local_dir_folders(tmp_path):
    registered = {}
    names = register_all(lambda fn: registered.setdefault(fn.__name__, fn))
    assert "inline_swin_tiny" in names and set(registered) == set(inline_attn.list_models())
    model = registered["inline_deit_tiny"](
        pretrained=False, pretrained_cfg_overlay={"crop_pct": 1.0, "tag": "x"}, depth=2
    )
    assert model.pretrained_cfg.get("crop_pct") == 1.0 and model.pretrained_cfg.extra["tag"] == "x"
    # timm.create_model("local-dir:PATH"): config.json's pretrained_cfg with file/source added, model_args as kwargs
    saved = inline_attn.create_model("inline_deit_tiny", depth=2, num_classes=5).eval()
    inline_attn.save_pretrained(saved, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    cfg = {**config["pretrained_cfg"], "file": str(tmp_path), "source": "local-dir"}
    fn = entrypoint(config["architecture"])
    # timm 1.0 passes the folder's model_args twice: one by one, and as the record pretrained_model_args
    args = config["model_args"]
    loaded = fn(
        pretrained=True, pretrained_cfg=cfg, features_only=True, out_indices=(1,), pretrained_model_args=args, **args
    )
    want = saved.forward_intermediates(torch.randn(1, 3, 224, 224).zero_(), indices=(1,), intermediates_only=True)
    got = loaded.eval()(torch.zeros(1, 3, 224, 224))
    torch.testing.assert_close(got[0], want[0])


def test_model_card_and_timm_written_folder(tmp_path):
    model = inline_attn.create_model("inline_deit_tiny")
    inline_attn.save_pretrained(model, tmp_path / "ours")
    card = (tmp_path / "ours" / "README.md").read_text()
    front = card.split("---")[1]
    assert "library_name: inline-attn" in front and "arxiv:2412.06590" in front and "license: mit" in front
    assert "value: 74.5" in front and '"architecture": "inline_deit_tiny"' in card
    custom = inline_attn.create_model("inline_deit_tiny", depth=2)
    inline_attn.save_pretrained(custom, tmp_path / "custom")
    assert "model-index" not in (tmp_path / "custom" / "README.md").read_text()  # not the published network
    # the layout timm's save_for_hf writes: classifier settings at the top level, its pretrained_cfg
    timm_dir = tmp_path / "timm"
    inline_attn.save_pretrained(inline_attn.create_model("inline_deit_tiny", depth=2, num_classes=3), timm_dir)
    config = json.loads((timm_dir / "config.json").read_text())
    args = config["model_args"]
    timm_config = {
        "architecture": "inline_deit_tiny",
        "num_classes": args.pop("num_classes"),
        "num_features": 192,
        "global_pool": args.pop("global_pool"),
        "model_args": args,
        "pretrained_cfg": {"input_size": [3, 224, 224], "crop_pct": 0.875, "custom_load": False},
    }
    (timm_dir / "config.json").write_text(json.dumps(timm_config))
    # save_for_hf without safe_serialization (its default) writes a torch pickle, pytorch_model.bin
    state = read_state_dict(timm_dir / "model.safetensors")
    (timm_dir / "model.safetensors").unlink()
    torch.save(state, timm_dir / "pytorch_model.bin")
    loaded = inline_attn.from_pretrained(timm_dir)
    assert loaded.num_classes == 3 and len(loaded.blocks) == 2
    torch.testing.assert_close(loaded.state_dict(), state, rtol=0, atol=0)


def test_hub_round_trip_through_a_standin(tmp_path, monkeypatch):
    """push_to_hub uploads the save_pretrained folder, from_pretrained("hf-hub:...") downloads it:
    a stand-in huggingface_hub keeps the 'remote' repositories in a local folder."""
    remote = tmp_path / "remote"
    calls = []

    class HfApi:
        def __init__(self, token=None):
            self.token = token

        def create_repo(self, repo_id, private=False, exist_ok=False):
            calls.append(("create", repo_id, private))

        def upload_folder(self, repo_id, folder_path, commit_message):
            import shutil

            shutil.copytree(folder_path, remote / repo_id)
            return f"https://huggingface.co/{repo_id}/commit/0"

    def snapshot_download(repo_id, revision=None, allow_patterns=None):
        calls.append(("download", repo_id, tuple(allow_patterns)))
        return str(remote / repo_id)

    monkeypatch.setitem(
        sys.modules, "huggingface_hub", types.SimpleNamespace(HfApi=HfApi, snapshot_download=snapshot_download)
    )
    from inline_attn.models.hub import push_to_hub

    model = inline_attn.create_model("inline_deit_tiny", depth=1).eval()
    assert push_to_hub(model, "someone/tiny").endswith("/commit/0")
    assert sorted(p.name for p in (remote / "someone/tiny").iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
    ]
    loaded = inline_attn.from_pretrained("hf-hub:someone/tiny")
    x = torch.randn(1, 3, 224, 224)
    torch.testing.assert_close(loaded(x), model(x))
    assert calls[0] == ("create", "someone/tiny", False) and calls[-1][0] == "download"
    with pytest.raises(ValueError, match="owner/name"):
        inline_attn.from_pretrained("hf-hub:nope")


def test_hub_without_huggingface_hub_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ImportError, match=r"inline-attn\[hub\]"):
        inline_attn.from_pretrained("hf-hub:someone/tiny")
