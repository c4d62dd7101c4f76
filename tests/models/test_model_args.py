"""create_model's common arguments give clear errors; images smaller than the stem are padded
with a one-time warning."""

import inspect
import json
import re
import typing
import warnings

import pytest
import torch

from inline_attn import create_model, from_pretrained
from inline_attn.layers import patch_embed


NAN = float("nan")

# (model, bad overrides, the argument the refusal names, what it says was expected)
BAD_ARGS = [
    ("inline_deit_tiny", {"num_classes": -1}, "num_classes", "an integer >= 0"),
    ("inline_deit_tiny", {"num_classes": 2.5}, "num_classes", "an integer >= 0"),
    ("inline_deit_tiny", {"depth": "4"}, "depth", "an integer >= 1"),
    ("inline_deit_tiny", {"in_chans": 0}, "in_chans", "an integer >= 1"),
    ("inline_deit_tiny", {"img_size": (32, "32")}, "img_size", "a positive integer or a (height, width) pair"),
    ("inline_deit_tiny", {"img_size": (32, 32, 32)}, "img_size", "a positive integer or a (height, width) pair"),
    ("inline_deit_tiny", {"patch_size": 8.0}, "patch_size", "an integer >= 1"),
    ("inline_deit_tiny", {"patch_size": True}, "patch_size", "an integer >= 1"),
    ("inline_deit_tiny", {"local_residual": "yes"}, "local_residual", "true or false, or None"),
    ("inline_deit_tiny", {"local_residual": 1}, "local_residual", "true or false, or None"),
    ("inline_deit_tiny", {"qkv_bias": "no"}, "qkv_bias", "true or false"),
    ("inline_deit_tiny", {"qkv_bias": 0}, "qkv_bias", "true or false"),
    ("inline_deit_tiny", {"features_only": "no"}, "features_only", "true or false"),
    ("inline_deit_tiny", {"attn_drop_rate": NAN}, "attn_drop_rate", "a number in [0, 1)"),
    ("inline_deit_tiny", {"attn_drop_rate": 1.5}, "attn_drop_rate", "a number in [0, 1)"),
    ("inline_deit_tiny", {"attn_drop_rate": 1}, "attn_drop_rate", "a number in [0, 1)"),
    ("inline_deit_tiny", {"drop_path_rate": -0.1}, "drop_path_rate", "a number in [0, 1)"),
    ("inline_deit_tiny", {"drop_rate": float("inf")}, "drop_rate", "a number in [0, 1)"),
    ("inline_deit_tiny", {"mlp_ratio": -1}, "mlp_ratio", "a number > 0"),
    ("inline_deit_tiny", {"mlp_ratio": 0}, "mlp_ratio", "a number > 0"),
    ("inline_deit_tiny", {"mlp_ratio": "4"}, "mlp_ratio", "a number > 0"),
    ("inline_deit_tiny", {"impl": "fast"}, "impl", "one of"),
    ("inline_deit_tiny", {"pattern": 1}, "pattern", "a string"),
    ("inline_pvt_tiny", {"sr_ratios": (0, 4, 2, 1)}, "sr_ratios", "a list of integers >= 1"),
    ("inline_pvt_tiny", {"sr_ratios": (-8, 4, 2, 1)}, "sr_ratios", "a list of integers >= 1"),
    ("inline_pvt_tiny", {"sr_ratios": (8.0, 4, 2, 1)}, "sr_ratios", "a list of integers >= 1"),
    ("inline_pvt_tiny", {"mlp_ratios": (8, 8, 4, -4)}, "mlp_ratios", "a list of numbers > 0"),
    ("inline_pvt_tiny", {"depths": (1, 0, 1, 1)}, "depths", "a list of integers >= 1"),
    ("inline_pvt_tiny", {"depths": ()}, "depths", "a list of integers >= 1"),
    ("inline_swin_tiny", {"window_size": 0}, "window_size", "an integer >= 1"),
    ("inline_swin_tiny", {"depths": 2}, "depths", "a list of integers >= 1"),
    ("inline_cswin_tiny", {"split_size": 0}, "split_size", ">= 1"),
    ("inline_cswin_tiny", {"embed_dim": None}, "embed_dim", "an integer >= 1"),
]


@pytest.mark.parametrize("name, kwargs, arg, expected", BAD_ARGS, ids=lambda v: repr(v)[:40])
def test_bad_model_arguments_are_refused_naming_the_argument(name, kwargs, arg, expected):
    with pytest.raises(ValueError) as e, torch.device("meta"):
        create_model(name, **kwargs)
    message = str(e.value)
    assert f"create_model({name!r}, {arg}={kwargs[arg]!r}): expected" in message and expected in message, message


@pytest.mark.parametrize(
    "name, pattern, message",
    [
        ("inline_swin_tiny", "M0", "one of I/S/L"),  # one letter for four stages
        ("inline_swin_tiny", "IIMS9", r"block count of a mixed stage must be in \[1, 6\]"),  # stage 3: 6 blocks
        ("inline_swin_tiny", "IIMS7", r"block count of a mixed stage must be in \[1, 6\]"),
        ("inline_swin_tiny", "IIMS0", r"block count of a mixed stage must be in \[1, 6\]"),  # none InLine
        ("inline_deit_tiny", "M0", r"block count of a mixed stage must be in \[1, 12\]"),
        ("inline_deit_tiny", "M13", r"block count of a mixed stage must be in \[1, 12\]"),
    ],
)
def test_a_pattern_s_mixed_count_must_fit_its_stages(name, pattern, message):
    with pytest.raises(ValueError, match=rf"pattern {pattern!r}.*{message}"), torch.device("meta"):
        create_model(name, pattern=pattern)


@pytest.mark.parametrize("name, pattern", [("inline_deit_tiny", "M5"), ("inline_swin_tiny", "IIMS5")])
def test_a_valid_mixed_pattern_mixes(name, pattern):
    with torch.device("meta"):
        model = create_model(name, pattern=pattern)
    assert model.pattern == pattern


@pytest.mark.parametrize("name", [None, 3, ("inline_deit_tiny",)])
def test_a_model_name_that_is_no_string_is_refused(name):
    with pytest.raises(ValueError, match=rf"model name {re.escape(repr(name))}: expected a registered model's name"):
        create_model(name)


def test_an_argument_the_family_does_not_take_is_named_with_a_suggestion():
    with pytest.raises(ValueError, match=r"model 'inline_deit_tiny' takes no argument 'windw_size'"):
        create_model("inline_deit_tiny", windw_size=7)
    with pytest.raises(ValueError, match=r"takes no argument 'depths' \(did you mean depth\?\)"):
        create_model("inline_deit_tiny", depths=(1, 0))


def test_every_family_argument_has_a_type_the_check_understands():
    # the check reads the constructors' annotations: an argument without one would pass unchecked
    from inline_attn.models import InLineCSwin, InLineDeiT, InLinePVT, InLineSwin
    from inline_attn.models.args import expected_of

    for cls in (InLineDeiT, InLinePVT, InLineSwin, InLineCSwin):
        hints = typing.get_type_hints(cls.__init__)
        params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        assert set(params) <= set(hints), f"{cls.__name__}: unannotated {set(params) - set(hints)}"
    assert expected_of("sr_ratios", typing.Sequence[int]) == "a list of integers >= 1"


@pytest.mark.parametrize("name, kwargs, arg, expected", BAD_ARGS[:12:3], ids=lambda v: repr(v)[:40])
def test_from_pretrained_refuses_the_same_values_with_the_same_message(tmp_path, name, kwargs, arg, expected):
    value = kwargs[arg]
    if isinstance(value, float) and value != value:
        pytest.skip("JSON holds no NaN")
    config = {
        "architecture": name,
        "model_args": {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"")
    shown = tuple(value) if isinstance(value, (list, tuple)) else value
    with pytest.raises(ValueError, match=re.escape(f"create_model({name!r}, {arg}={shown!r}): expected {expected}")):
        from_pretrained(tmp_path)


@pytest.mark.parametrize("name, kwargs, arg, expected", BAD_ARGS[1:12:5], ids=lambda v: repr(v)[:40])
def test_the_command_line_refuses_the_same_values_with_the_same_message(tmp_path, capsys, name, kwargs, arg, expected):
    from inline_attn.cli import main

    value = kwargs[arg]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{name: {name}}}\ndata: {{dataset: fmnist, path: {tmp_path}}}\n")
    assert (
        main(["train", "-c", str(cfg), "--output", str(tmp_path / "run"), "--set", f"model.kwargs.{arg}={value!r}"])
        == 2
    )
    assert f"create_model({name!r}, {arg}={value!r}): expected {expected}" in capsys.readouterr().err


def test_zero_classes_is_a_headless_model():
    m = create_model("inline_deit_tiny", num_classes=0, depth=1, embed_dim=24, num_heads=2, img_size=32)
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 24)


@pytest.mark.parametrize(
    "name, kwargs, size",
    [
        ("inline_deit_tiny", dict(depth=1, embed_dim=24, num_heads=2, img_size=32), (8, 9)),
        ("inline_cswin_tiny", dict(depths=(1, 1, 1, 1), embed_dim=16, num_heads=(1, 1, 2, 2), img_size=32), (2, 2)),
    ],
)
def test_image_smaller_than_the_stem_is_padded_with_one_warning(name, kwargs, size, monkeypatch):
    monkeypatch.setattr(patch_embed, "_WARNED_SMALL", set())
    m = create_model(name, num_classes=3, **kwargs).eval()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        y1 = m(torch.randn(1, 3, *size))
        y2 = m(torch.randn(2, 3, *size))
        m(torch.randn(1, 3, 32, 32))
    msgs = [str(w.message) for w in caught if "smaller than the stem" in str(w.message)]
    assert len(msgs) == 1 and str(tuple(size)) in msgs[0], msgs
    assert y1.shape == (1, 3) and y2.shape == (2, 3) and torch.isfinite(y1).all()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved")
    create_model("inline_deit_tiny", depth=1, embed_dim=16, num_heads=2, img_size=32).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dtype=torch.int64), r"from_pretrained\(dtype=torch.int64\): expected a floating torch.dtype"),
        (dict(dtype="float16"), r"from_pretrained\(dtype='float16'\): expected a floating torch.dtype"),
        (dict(device="bogus"), r"from_pretrained\(device='bogus'\): not a device"),
        pytest.param(
            dict(device="cuda"),
            r"from_pretrained\(device='cuda'\): CUDA is not available",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the device exists"),
        ),
    ],
)
def test_from_pretrained_refuses_a_dtype_or_device_it_cannot_give(saved, kwargs, message):
    with pytest.raises(ValueError, match=message):
        from_pretrained(saved, **kwargs)
    assert from_pretrained(saved, dtype=torch.float64).head.weight.dtype == torch.float64  # a neighbour


@pytest.mark.parametrize(
    "change, message",
    [
        ({"features_only": "yes"}, r"features_only='yes', expected true or false"),
        ({"dtype": "int64"}, r"dtype='int64', expected a floating dtype"),
        ({"dtype": "nn"}, r"dtype='nn', not a torch dtype"),
        (
            {"model_args": {"embed_dim": None}},
            r"create_model\('inline_deit_tiny', embed_dim=None\): expected an integer",
        ),
    ],
)
def test_a_config_json_field_of_the_wrong_type_is_refused(saved, tmp_path, change, message):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(saved, folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in change.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        from_pretrained(folder)


@pytest.mark.parametrize("source", [None, 3, b"w.pth", ["w.pth"]])
def test_load_checkpoint_refuses_a_source_that_is_no_path_or_mapping(source):
    from inline_attn import load_checkpoint

    with pytest.raises(ValueError, match=r"load_checkpoint: source=.*: expected a checkpoint path or a state dict"):
        load_checkpoint(torch.nn.Linear(2, 2), source)
