"""phi is ``feature_map`` (issue 24); the old name ``kernel`` keeps working.

- the old keyword ``kernel=`` on every public function and class: a ``FutureWarning`` pointing at
  the caller, the same result bit for bit, and a ``ValueError`` naming both values when both are given;
- the old module-level names (``KERNELS``, ``get_kernel``, ``Kernel``, ``make_kernel``,
  ``KERNEL_CHOICES``) with a warning, ``AffineReLUKernel`` as the same class;
- files written before the rename (a run's config, a checkpoint's ``model_kwargs`` and weights, a
  ``save_pretrained`` folder, an ablation's overrides) load to the same model, silently.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import yaml
from conftest import SMALL_OVERRIDES

from inline_attn import create_model, from_pretrained, layers, ops, save_pretrained
from inline_attn.layers import AffineReLUFeatureMap, InLineAttention, TokenAttention, build_attention
from inline_attn.models.checkpoint import load_checkpoint
from inline_attn.ops.tokens import inline_layer_tokens

DEPRECATED = r"`kernel=` is deprecated, use `feature_map=`"
SMALL = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=2, num_classes=3)


def _qkv(n=12, d=4):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 2, n, d, generator=g, dtype=torch.float64) for _ in range(3)]


def _tokens():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(2, 1 + 12, 8, generator=g, dtype=torch.float64) for _ in range(3)]


def _old_keyword(fn, *args, **kwargs):
    """fn(..., kernel=...) under a FutureWarning attributed to this file."""
    with pytest.warns(FutureWarning, match=DEPRECATED) as record:
        out = fn(*args, **kwargs)
    assert record[0].filename == __file__, "the warning must point at the caller, not inside the package"
    return out


@pytest.fixture
def no_future_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        yield


OPS = {
    "attention": lambda kw: ops.attention(*_qkv(), kind="linear", **kw),
    "attention_weights": lambda kw: ops.attention_weights(*_qkv()[:2], kind="inline", **kw),
    "naive_attention": lambda kw: ops.naive_attention(*_qkv(), kind="inline", **kw),
    "inline_attention": lambda kw: ops.inline_attention(*_qkv(), **kw),
    "linear_attention": lambda kw: ops.linear_attention(*_qkv(), **kw),
    "inline_tokens": lambda kw: ops.inline_tokens(*_tokens(), num_heads=2, feat_size=(3, 4), num_prefix_tokens=1, **kw),
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_ops_take_the_old_keyword_with_a_warning_and_the_same_result(op, no_future_warnings):
    new = OPS[op]({"feature_map": "exp"})
    warnings.simplefilter("default", FutureWarning)
    old = _old_keyword(OPS[op], {"kernel": "exp"})
    assert torch.equal(old, new)


def test_both_keywords_raise_naming_both_values():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"attention\(\) got both kernel='exp' and feature_map='relu'"):
        ops.attention(q, k, v, kernel="exp", feature_map="relu")
    with pytest.raises(ValueError, match=r"TokenAttention\(\) got both kernel='relu' and feature_map='exp'"):
        InLineAttention(8, 2, kernel="relu", feature_map="exp")
    with pytest.raises(ValueError, match="kernel='relu' and feature_map='exp'"):
        create_model("inline_deit_tiny", kernel="relu", feature_map="exp", **SMALL)
    from inline_attn.experiments.ablations import swin_setting

    with pytest.raises(ValueError, match="kernel='exp' and feature_map='relu'"):  # the new one given by position
        swin_setting("inline", "relu", kernel="exp")


def test_layer_core_and_layers_take_the_old_keyword(no_future_warnings):
    x, q, k = _tokens()
    w1, b1 = torch.randn(8, 4, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    w2, b2 = torch.randn(72, 4, dtype=torch.float64), torch.randn(72, dtype=torch.float64)
    core = dict(predictor=(w1, b1, w2, b2), num_heads=2, feat_size=(3, 4), num_prefix_tokens=1)
    new = inline_layer_tokens(x, q, k, q, feature_map="relu", **core)
    warnings.simplefilter("default", FutureWarning)
    assert torch.equal(_old_keyword(inline_layer_tokens, x, q, k, q, kernel="relu", **core), new)

    xs = torch.randn(2, 1 + 12, 16)
    for build in (TokenAttention, InLineAttention, lambda *a, **kw: build_attention("linear", *a, **kw)):
        torch.manual_seed(0)
        layer = build(16, 2, num_prefix_tokens=1, feature_map="affine_relu")
        torch.manual_seed(0)
        old = _old_keyword(build, 16, 2, num_prefix_tokens=1, kernel="affine_relu")
        assert isinstance(old.feature_map, AffineReLUFeatureMap)
        assert torch.equal(old(xs, (3, 4)), layer(xs, (3, 4)))
        out = _old_keyword(layer.attend_tokens, *[xs] * 3, feat_size=(3, 4), num_prefix_tokens=1, kernel="relu")
        assert torch.equal(
            out, layer.attend_tokens(*[xs] * 3, feat_size=(3, 4), num_prefix_tokens=1, feature_map="relu")
        )


@pytest.mark.parametrize("name", ["inline_deit_tiny", "inline_swin_tiny", "inline_pvt_tiny", "inline_cswin_tiny"])
def test_models_take_the_old_keyword_and_record_the_new(name):
    family = name.split("_")[1]
    args = {**SMALL_OVERRIDES[family], "pattern": {"deit": "L"}.get(family, "ILSS"), "num_classes": 3}
    torch.manual_seed(0)
    new = create_model(name, feature_map="relu", **args).eval()
    torch.manual_seed(0)
    old = _old_keyword(create_model, name, kernel="relu", **args).eval()
    assert old.model_args == new.model_args and "kernel" not in old.model_args
    assert old.model_args["feature_map"] == "relu"
    size = args["img_size"]
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        assert torch.equal(old(x), new(x))
    torch.manual_seed(0)
    direct_new = type(new)(feature_map="relu", **args).state_dict()  # the constructor itself, not only create_model
    torch.manual_seed(0)
    direct_old = _old_keyword(type(new), kernel="relu", **args).state_dict()
    assert direct_old.keys() == direct_new.keys() and all(torch.equal(direct_old[k], direct_new[k]) for k in direct_new)


def test_old_module_names_warn_and_alias_the_new_objects():
    from inline_attn.ops import feature_maps

    assert layers.AffineReLUKernel is AffineReLUFeatureMap  # one class, two names
    cases = [
        (ops, "KERNELS", ops.FEATURE_MAPS),
        (ops, "get_kernel", ops.get_feature_map),
        (feature_maps, "Kernel", feature_maps.FeatureMap),
        (layers, "KERNEL_CHOICES", layers.FEATURE_MAP_CHOICES),
        (layers, "make_kernel", layers.make_feature_map),
    ]
    for module, old, new in cases:
        with pytest.warns(FutureWarning, match=f"{module.__name__}.{old}` is deprecated"):
            assert getattr(module, old) is new
    with pytest.raises(AttributeError):
        ops.no_such_name  # noqa: B018
    layer = InLineAttention(8, 2, feature_map="relu")
    with pytest.warns(FutureWarning, match=r"`\.kernel` is deprecated, use `\.feature_map`"):
        assert layer.kernel == "relu"
    with pytest.warns(FutureWarning, match=r"`\.kernel` is deprecated"):
        layer.kernel = "exp"
    assert layer.feature_map == "exp"


def test_error_messages_say_feature_map():
    q = torch.randn(1, 1, 4, 4)
    with pytest.raises(ValueError, match=r"unknown feature map 'gelu': expected one of \['exp', 'identity'"):
        ops.attention(q, q, q, feature_map="gelu")
    with pytest.raises(ValueError, match="unknown feature map 'gelu': expected one of .*affine_relu"):
        InLineAttention(8, 2, feature_map="gelu")


# --- files written before the rename


def _old_state_dict(model) -> dict:
    """The state dict as it was saved when the learnable feature map's attribute was ``kernel``."""
    return {k.replace(".feature_map.", ".kernel."): v for k, v in model.state_dict().items()}


def test_old_checkpoint_keys_load_into_the_renamed_attribute(no_future_warnings):
    torch.manual_seed(0)
    src = create_model("inline_deit_tiny", feature_map="affine_relu", **SMALL)
    old = _old_state_dict(src)
    assert any(".kernel.affine." in k for k in old)
    for load in (lambda m: m.load_state_dict(old), lambda m: load_checkpoint(m, old)):
        torch.manual_seed(1)
        dst = create_model("inline_deit_tiny", feature_map="affine_relu", **SMALL)
        load(dst)
        for key, value in src.state_dict().items():
            assert torch.equal(dst.state_dict()[key], value), key


def test_old_trained_checkpoint_and_run_folder_load_silently(tmp_path, no_future_warnings):
    """A checkpoint of our trainer (``model_name``, ``model_kwargs`` with ``kernel``, weights under
    ``kernel.``) and a run folder whose config.yaml says ``model.kwargs.kernel`` rebuild the model."""
    from inline_attn.train.evaluate import load_trained_model

    torch.manual_seed(0)
    src = create_model("inline_deit_tiny", feature_map="affine_relu", **SMALL).eval()
    kwargs = {**SMALL, "kernel": "affine_relu"}
    torch.save(
        {"model_name": "inline_deit_tiny", "model_kwargs": kwargs, "model": _old_state_dict(src)}, tmp_path / "a.pth"
    )
    net, record = load_trained_model(tmp_path / "a.pth")
    assert record["model_kwargs"] == {**SMALL, "feature_map": "affine_relu"}
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(net(x), src(x))

    run = tmp_path / "run"
    run.mkdir()
    config = {"model": {"name": "inline_deit_tiny", "kwargs": kwargs}, "data": {"dataset": "folder", "img_size": 32}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    torch.save({"model": _old_state_dict(src)}, run / "last.pth")  # a checkpoint that predates model_kwargs
    net, record = load_trained_model(run)
    assert record["model_kwargs"]["feature_map"] == "affine_relu" and "kernel" not in record["model_kwargs"]
    with torch.no_grad():
        assert torch.equal(net(x), src(x))


def test_old_config_keys_load_resume_and_save_the_new_name(tmp_path, no_future_warnings):
    from inline_attn.train.config import load_config, resume_differences

    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump({"model": {"name": "inline_deit_tiny", "kwargs": {"kernel": "relu"}}}))
    cfg = load_config(old)
    assert cfg.model.kwargs == {"feature_map": "relu"}
    new = load_config(None, [("model.kwargs.feature_map", "relu")])
    # a run started before the rename resumes under a config that says feature_map (and back)
    assert resume_differences({"model": {"name": "inline_deit_tiny", "kwargs": {"kernel": "relu"}}}, new) == []
    assert resume_differences(new.to_dict(), cfg) == []
    cfg.save(tmp_path / "saved.yaml")
    assert yaml.safe_load((tmp_path / "saved.yaml").read_text())["model"]["kwargs"] == {"feature_map": "relu"}
    with pytest.raises(ValueError, match="both kernel='relu' and feature_map='exp'"):
        load_config(old, [("model.kwargs.feature_map", "exp")])


def test_old_dense_config_and_pretrained_folder_load_silently(tmp_path, no_future_warnings):
    from inline_attn.dense.config import DenseModelCfg

    assert DenseModelCfg(backbone_kwargs={"kernel": "relu"}).backbone_kwargs == {"feature_map": "relu"}

    torch.manual_seed(0)
    src = create_model("inline_deit_tiny", feature_map="affine_relu", **SMALL).eval()
    folder = save_pretrained(src, tmp_path / "pretrained")
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["model_args"] = {("kernel" if k == "feature_map" else k): v for k, v in config["model_args"].items()}
    config_path.write_text(json.dumps(config))
    dst = from_pretrained(folder)
    assert dst.model_args["feature_map"] == "affine_relu"
    for key, value in src.state_dict().items():
        assert torch.equal(dst.state_dict()[key], value), key


def test_ablation_settings_keep_their_keys_and_read_old_overrides(no_future_warnings):
    """The setting keys (run folders, result JSONs) do not change; new runs override
    ``model.kwargs.feature_map``, and an old run's stored ``model.kwargs.kernel`` gives the same config."""
    from inline_attn.experiments.ablations import ABLATION_CONFIG, swin_setting
    from inline_attn.train.config import configs_dir, load_config

    setting = swin_setting("linear", "affine_relu", residual=False)
    assert setting.key == "linear-affine_relu-w28" and setting.label == "linear, affine_relu, window 28"
    assert ("model.kwargs.feature_map", "affine_relu") in setting.overrides
    old_overrides = [("model.kwargs.kernel" if k == "model.kwargs.feature_map" else k, v) for k, v in setting.overrides]
    new = load_config(configs_dir() / ABLATION_CONFIG, setting.overrides)
    assert load_config(configs_dir() / ABLATION_CONFIG, old_overrides) == new
