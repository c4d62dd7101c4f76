"""DenseBackbone: four maps at strides 4-8-16-32 for every family, frozen stages, norm_eval,
drop path, no-decay groups, classification checkpoints as initialisation."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn

from inline_attn import create_model, save_checkpoint
from inline_attn.dense import DenseBackbone
from inline_attn.runtime.optim import no_decay_names, param_groups

from seg_helpers import TINY


@pytest.mark.parametrize("family", sorted(TINY))
@pytest.mark.parametrize("size", [(64, 64), (64, 96)], ids=["64x64", "64x96"])
def test_four_maps_at_strides(family, size):
    name, kw = TINY[family]
    bb = DenseBackbone(name, **kw)
    assert bb.strides == [4, 8, 16, 32]
    x = torch.randn(2, 3, *size)
    maps = bb(x)
    assert len(maps) == 4
    for m, c, s in zip(maps, bb.out_channels, bb.strides):
        assert m.shape == (2, c, size[0] // s, size[1] // s)
        assert torch.isfinite(m).all()
    sum(m.mean() for m in maps).backward()
    no_grad = [n for n, p in bb.named_parameters() if p.requires_grad and p.grad is None]
    assert not no_grad, no_grad


def test_out_indices_subset():
    name, kw = TINY["pvt"]
    bb = DenseBackbone(name, out_indices=(1, 3), **kw)
    maps = bb(torch.randn(1, 3, 64, 64))
    assert [m.shape[1] for m in maps] == bb.out_channels == [16, 32] and bb.strides == [8, 32]
    for bad in ((4,), (1, 1)):  # a level that does not exist; one level twice (fewer maps than asked for)
        with pytest.raises(ValueError, match=re.escape(f"out_indices={bad!r} must be a non-empty subset")):
            DenseBackbone(name, out_indices=bad, **kw)


@pytest.mark.parametrize("family", sorted(TINY))
def test_frozen_stages(family):
    name, kw = TINY[family]
    free = DenseBackbone(name, **kw)
    stem = DenseBackbone(name, frozen_stages=0, **kw)
    two = DenseBackbone(name, frozen_stages=2, **kw)
    n_free = sum(p.requires_grad for p in free.parameters())
    n_stem = sum(p.requires_grad for p in stem.parameters())
    n_two = sum(p.requires_grad for p in two.parameters())
    assert n_free == len(list(free.parameters())) > n_stem > n_two > 0
    frozen = {n for n, p in two.named_parameters() if not p.requires_grad}
    stem_names = {
        "pvt": "body.patch_embed1.proj.weight",
        "swin": "body.patch_embed.proj.weight",
        "cswin": "body.stage1_conv_embed.0.weight",
        "deit": "body.patch_embed.proj.weight",
    }[family]
    assert stem_names in frozen
    last_stage = {
        "pvt": "body.block4.0.",
        "swin": "body.layers.3.",
        "cswin": "body.stage4.0.",
        "deit": "body.blocks.3.",
    }[family]
    assert not any(n.startswith(last_stage) for n in frozen)
    # frozen parts stay in eval mode after .train() (dropout / drop path off there)
    two.train()
    modes = {n: m.training for n, m in two.named_modules()}
    first = {"pvt": "body.block1", "swin": "body.layers.0", "cswin": "body.stage1", "deit": "body.blocks.0"}[family]
    assert modes[first] is False and modes[last_stage[:-1]] is True
    # and their outputs do not change after an optimizer step on everything trainable
    x = torch.randn(1, 3, 64, 64)
    opt = torch.optim.SGD([p for p in two.parameters() if p.requires_grad], lr=0.1)
    before = {n: p.detach().clone() for n, p in two.named_parameters() if not p.requires_grad}
    sum(m.square().mean() for m in two(x)).backward()
    opt.step()
    assert all(torch.equal(before[n], p) for n, p in two.named_parameters() if n in before)


def test_frozen_stages_bounds():
    name, kw = TINY["pvt"]
    with pytest.raises(ValueError, match="frozen_stages"):
        DenseBackbone(name, frozen_stages=5, **kw)


def test_norm_eval_keeps_batchnorm_statistics():
    name, kw = TINY["pvt"]
    bb = DenseBackbone(name, norm_eval=True, **kw)
    bb.extra_bn = nn.BatchNorm2d(3)  # the families use LayerNorm; norm_eval is about BatchNorm
    bb.train()
    assert bb.extra_bn.training is False
    bb2 = DenseBackbone(name, norm_eval=False, **kw)
    bb2.extra_bn = nn.BatchNorm2d(3)
    bb2.train()
    assert bb2.extra_bn.training is True


def test_drop_path_rate_reaches_the_blocks():
    name, kw = TINY["pvt"]
    bb = DenseBackbone(name, drop_path_rate=0.3, **kw)
    rates = [m.p for m in bb.modules() if type(m).__name__ == "DropPath"]
    assert rates and max(rates) == pytest.approx(0.3)
    assert not [
        m for m in DenseBackbone(name, drop_path_rate=0.0, **kw).modules() if type(m).__name__ == "DropPath" and m.p > 0
    ]


@pytest.mark.parametrize(
    "family,expected",
    [
        ("pvt", {"body.pos_embed1", "body.pos_embed4"}),
        ("deit", {"body.pos_embed", "body.cls_token"}),
        ("swin", {"body.layers.0.blocks.0.attn.relative_position_bias_table"}),
    ],
)
def test_no_decay_groups(family, expected):
    name, kw = TINY[family]
    if family == "swin":
        kw = dict(kw, pattern="SSSS")  # softmax blocks carry relative-position tables
    bb = DenseBackbone(name, **kw)
    names = set(no_decay_names(bb))
    assert expected <= names
    assert all(n in names for n, p in bb.named_parameters() if p.ndim <= 1)  # norms and biases
    decay = param_groups(bb, 0.05)[1]["params"]
    assert all(p.ndim > 1 for p in decay) and decay


@pytest.mark.parametrize("family", ["pvt", "deit", "swin"])
def test_classification_checkpoint_initialises_backbone(tmp_path, family):
    name, kw = TINY[family]
    cls = create_model(name, num_classes=7, **kw)
    path = tmp_path / "cls.safetensors"
    save_checkpoint(cls, path)
    bb = DenseBackbone(name, pretrained=str(path), **kw)
    own = bb.body.state_dict()
    src = cls.state_dict()
    assert own and all(torch.equal(own[k], src[k]) for k in own)
    bad = create_model(
        "inline_pvt_tiny" if family != "pvt" else "inline_swin_tiny", **TINY["pvt" if family != "pvt" else "swin"][1]
    )
    save_checkpoint(bad, tmp_path / "other.safetensors")
    with pytest.raises(ValueError, match="does not fit"):
        DenseBackbone(name, pretrained=str(tmp_path / "other.safetensors"), **kw)


def test_training_checkpoint_of_ours_initialises_backbone(tmp_path):
    import numpy as np

    name, kw = TINY["pvt"]
    cls = create_model(name, num_classes=10, **kw)
    path = tmp_path / "last.pth"  # as `inline-attn train` writes it: weights beside config and RNG states
    torch.save(
        {
            "model": cls.state_dict(),
            "config": {"model": {"name": name}},
            "rank_states": [{"rng": {"numpy": np.random.get_state()}}],
        },
        path,
    )
    with pytest.raises(ValueError, match="weights_only=False"):
        DenseBackbone(name, pretrained=str(path), **kw)
    bb = DenseBackbone(name, pretrained=str(path), weights_only=False, **kw)
    assert torch.equal(bb.body.pos_embed1, cls.pos_embed1) and torch.equal(
        bb.body.block4[0].mlp.fc1.weight, cls.block4[0].mlp.fc1.weight
    )


# what the adapter's own per-family table said before the families stated it (stem, stage prefixes)
OLD_TABLE = {
    "pvt": (
        ["patch_embed1.", "pos_embed1"],
        lambda i: [f"block{i + 1}."] + ([f"patch_embed{i + 1}.", f"pos_embed{i + 1}"] if i else []),
    ),
    "swin": (["patch_embed."], lambda i: [f"layers.{i}."]),
    "cswin": (["stage1_conv_embed."], lambda i: [f"stage{i + 1}."] + ([f"merge{i}."] if i else [])),
}


def _owned(model, prefixes):
    return {
        n for n, _ in model.named_parameters() if any(n.startswith(p) and (p.endswith(".") or n == p) for p in prefixes)
    }


@pytest.mark.parametrize("family", sorted(TINY))
def test_the_models_state_what_frozen_stages_freeze(family):
    name, kw = TINY[family]
    body = DenseBackbone(name, **kw).body
    stem, stages = body.stage_prefixes()
    assert len(stages) == 4 and all(stages)
    if family == "deit":  # four equal groups of blocks
        depth = len(body.blocks)
        assert [len(s) for s in stages] == [round(depth * (i + 1) / 4) - round(depth * i / 4) for i in range(4)]
        return
    old_stem, old_stage = OLD_TABLE[family]
    assert _owned(body, stem) == _owned(body, old_stem)
    for k in range(5):  # freezing the first k stages: the same parameters as the old table
        new = _owned(body, [p for s in stages[:k] for p in s])
        old = _owned(body, [p for i in range(k) for p in old_stage(i)])
        assert new == old, k


@pytest.mark.parametrize("family", sorted(TINY))
def test_out_norms_and_pyramid_come_from_the_model(family):
    name, kw = TINY[family]
    backbone = DenseBackbone(name, **kw)
    assert (backbone.pyramid is not None) == (family == "deit") == backbone.body.single_scale
    has_norms = not isinstance(backbone.norms[0], nn.Identity)
    assert has_norms == (family in ("swin", "cswin")) == backbone.body.dense_out_norms
