"""save_pretrained / from_pretrained: every registered model round-trips; kwargs, dtypes, features_only, errors."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from model_helpers import SMALL_OVERRIDES
from model_helpers import meta_model

import inline_attn
from inline_attn import create_model, from_pretrained, get_model_config, list_models, save_pretrained
from inline_attn.models import InLineDeiT, InLineSwin

TINY = ["inline_deit_tiny", "inline_pvt_tiny", "inline_swin_tiny", "inline_cswin_tiny"]


def random_weights(name: str, seed: int) -> torch.nn.Module:
    """The registered model at its real configuration, built on the meta device and given random
    values (initialising the large variants costs seconds each; the round trip does not care)."""
    model = meta_model(name).to_empty(device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.is_floating_point():
                t.uniform_(-1, 1, generator=gen)
            else:
                t.random_(0, max(2, t.numel()), generator=gen)
    return model.eval()


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert sa[key].dtype == sb[key].dtype and torch.equal(sa[key], sb[key]), key


@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_round_trips(tmp_path, name):
    src = random_weights(name, seed=len(name))
    folder = save_pretrained(src, tmp_path / name)
    assert sorted(os.listdir(folder)) == ["README.md", "config.json", "model.safetensors"]  # no temporary file left
    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == name and config["dtype"] == "float32"
    assert config["pretrained_cfg"]["input_size"] == list(get_model_config(name).input_size)
    dst = from_pretrained(folder)
    assert type(dst) is type(src) and not dst.training and src.model_args.items() <= dst.model_args.items()
    assert_same_state(src, dst)


@pytest.mark.parametrize("name", TINY)
def test_tiny_models_compute_the_same_after_the_round_trip(tmp_path, name):
    torch.manual_seed(0)
    src = create_model(name).eval()  # real initialisation and configuration
    dst = from_pretrained(src.save_pretrained(tmp_path))
    x = torch.randn(1, *get_model_config(name).input_size)
    with torch.no_grad():
        torch.testing.assert_close(dst(x), src(x), rtol=0, atol=0)


@pytest.mark.parametrize("family", sorted(SMALL_OVERRIDES))
def test_kwargs_classifier_reset_and_dtype_survive(tmp_path, family):
    name = f"inline_{family}_tiny"
    pattern = {"deit": "L", "pvt": "IISS", "swin": "ISIS", "cswin": "IILS"}[family]
    args = {**SMALL_OVERRIDES[family], "num_classes": 4, "pattern": pattern, "feature_map": "relu"}
    src = create_model(name, **args).eval()
    src.reset_classifier(3)  # the saved head has 3 classes, not the 4 the model was built with
    src = src.to(torch.bfloat16)
    dst = from_pretrained(save_pretrained(src, tmp_path))
    assert dst.num_classes == 3 and next(dst.parameters()).dtype == torch.bfloat16
    assert_same_state(src, dst)
    size = SMALL_OVERRIDES[family]["img_size"]
    x = torch.randn(2, 3, size, size, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(dst(x), src(x), rtol=0, atol=0)
    as_float = from_pretrained(tmp_path, dtype=torch.float32)
    assert next(as_float.parameters()).dtype == torch.float32


def test_features_only_model_round_trips(tmp_path):
    src = create_model("inline_pvt_tiny", **SMALL_OVERRIDES["pvt"], features_only=True, out_indices=(1, 2)).eval()
    dst = from_pretrained(save_pretrained(src, tmp_path))
    assert dst.features_only and dst.out_indices == (1, 2)
    assert_same_state(src, dst)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        for a, b in zip(dst(x), src(x), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_family_classmethod_and_top_level_names(tmp_path):
    src = create_model("inline_deit_tiny", **SMALL_OVERRIDES["deit"])
    src.save_pretrained(tmp_path)
    assert isinstance(InLineDeiT.from_pretrained(tmp_path), InLineDeiT)
    with pytest.raises(ValueError, match="holds a InLineDeiT"):
        InLineSwin.from_pretrained(tmp_path)
    assert inline_attn.from_pretrained is from_pretrained and "save_pretrained" in inline_attn.__all__


@pytest.fixture
def saved(tmp_path):
    save_pretrained(create_model("inline_deit_tiny", **SMALL_OVERRIDES["deit"]), tmp_path / "m")
    return tmp_path / "m"


def test_missing_folder_and_files(tmp_path, saved):
    with pytest.raises(ValueError, match="is not a folder"):
        from_pretrained(tmp_path / "nowhere")
    (saved / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="model.safetensors' does not exist"):
        from_pretrained(saved)
    (saved / "config.json").unlink()
    with pytest.raises(ValueError, match="config.json' does not exist"):
        from_pretrained(saved)


@pytest.mark.parametrize(
    "text, match",
    [
        ("{not json", "cannot read .*config.json"),
        ("[1, 2]", "holds a list, expected a JSON object"),
        ('{"model_args": {}}', "architecture=None, expected a str"),
        ('{"architecture": "inline_deit_tiny", "model_args": {}, "format_version": 9}', "format_version=9"),
        ('{"architecture": "inline_deit_tinyy", "model_args": {}}', "unknown model 'inline_deit_tinyy'.*did you mean"),
        ('{"architecture": "inline_deit_tiny", "model_args": {"depth": "4"}}', "depth='4'"),
        ('{"architecture": "inline_deit_tiny", "model_args": {"colour": 1}}', "takes no argument 'colour'"),
        # issue 36: a misspelt key was ignored, and out_indices without features_only too
        ('{"architecture": "inline_deit_tiny", "model_args": {}, "dtyp": "float16"}', r"unknown keys \['dtyp'\]"),
        ('{"architecture": "inline_deit_tiny", "model_args": {}, "out_indices": [1]}', "out_indices without features"),
    ],
)
def test_bad_config_is_a_clear_error(saved, text, match):
    (saved / "config.json").write_text(text)
    with pytest.raises(ValueError, match=match):
        from_pretrained(saved)


def test_corrupt_or_mismatched_weights_are_clear_errors(saved):
    weights = saved / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cannot read checkpoint .*model.safetensors"):
        from_pretrained(saved)
    config = json.loads((saved / "config.json").read_text())
    save_pretrained(create_model("inline_deit_tiny", **{**SMALL_OVERRIDES["deit"], "depth": 3}), saved)
    (saved / "config.json").write_text(json.dumps(config))  # the weights of a deeper model
    with pytest.raises(ValueError, match="model.safetensors'.*does not fit InLineDeiT.*blocks.2"):
        from_pretrained(saved)


def test_what_config_json_cannot_describe_is_refused_before_writing(tmp_path):
    with pytest.raises(ValueError, match="built by inline_attn.create_model"):
        save_pretrained(InLineDeiT(**{k: v for k, v in SMALL_OVERRIDES["deit"].items()}), tmp_path / "a")
    model = create_model("inline_deit_tiny", **SMALL_OVERRIDES["deit"])
    model.model_args["embed_dim"] = torch.tensor(24)  # an argument JSON has no form for
    with pytest.raises(ValueError, match="embed_dim=tensor.*config.json cannot hold"):
        save_pretrained(model, tmp_path / "b")
    pruned = create_model("inline_deit_tiny", **SMALL_OVERRIDES["deit"])
    pruned.prune_intermediate_layers([0])
    with pytest.raises(ValueError, match="pruned .*prune_intermediate_layers"):
        save_pretrained(pruned, tmp_path / "c")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file, expected a folder"):
        save_pretrained(create_model("inline_deit_tiny", **SMALL_OVERRIDES["deit"]), tmp_path / "file")
    assert sorted(os.listdir(tmp_path)) == ["file"]
    blocked = tmp_path / "file" / "below"  # a folder that cannot be made: a file stands in the way
    with pytest.raises(ValueError, match="save_pretrained: folder .*below is not a folder"):
        save_pretrained(create_model("inline_deit_tiny", **SMALL_OVERRIDES["deit"]), blocked)


@pytest.mark.parametrize("folder", [None, 3, ["a"]])
def test_a_folder_that_is_no_path_is_refused(folder):
    with pytest.raises(ValueError, match=re.escape(f"from_pretrained: folder={folder!r}: expected a folder path")):
        from_pretrained(folder)


def test_customised_model_does_not_claim_the_published_models_facts(tmp_path):
    small = dict(img_size=64, embed_dim=8, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4), window_size=8)
    model = create_model("inline_swin_tiny", num_classes=10, pattern="ISIS", **small)
    facts = json.loads((save_pretrained(model, tmp_path / "m") / "config.json").read_text())["pretrained_cfg"]
    assert facts["num_classes"] == 10 and facts["extra"]["pattern"] == "ISIS"
    assert facts["input_size"] == [3, 64, 64]
    assert facts["paper_top1"] is None and facts["num_params"] is None and facts["macs_g"] is None
    published = get_model_config("inline_swin_tiny")
    with torch.device("meta"):  # only the config matters
        assert create_model("inline_swin_tiny", drop_path_rate=0.1).pretrained_cfg.paper_top1 == published.paper_top1
        assert create_model("inline_swin_tiny").pretrained_cfg is published
