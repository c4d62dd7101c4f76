"""BlockOptions: the options every family's block takes once and hands to its attention layer and MLP."""

from __future__ import annotations

import warnings

import pytest
import torch.nn as nn

from inline_attn.layers import BlockOptions
from inline_attn.models.cswin import CSwinBlock
from inline_attn.models.deit import DeiTBlock
from inline_attn.models.pvt import PVTBlock
from inline_attn.models.swin import SwinBlock

BLOCKS = {
    "deit": lambda **kw: DeiTBlock(16, 2, **kw),
    "pvt": lambda **kw: PVTBlock(16, 2, **kw),
    "swin": lambda **kw: SwinBlock(16, 2, window_size=4, shift_size=2, input_resolution=(8, 8), **kw),
    "cswin": lambda **kw: CSwinBlock(16, 2, split_size=2, **kw),
}


def test_options_split_into_the_layer_and_mlp_keywords():
    o = BlockOptions(mlp_ratio=2.0, qkv_bias=False, feature_map="relu", local_residual=False, drop=0.1, attn_drop=0.2)
    assert o.softmax() == dict(qkv_bias=False, attn_drop=0.2, proj_drop=0.1)
    assert o.attention() == dict(o.softmax(), feature_map="relu", local_residual=False)
    assert o.mlp() == dict(mlp_ratio=2.0, drop=0.1, drop_path=0.0, norm_layer=nn.LayerNorm)


@pytest.mark.parametrize("family", sorted(BLOCKS))
def test_an_unknown_option_is_a_type_error(family):
    with pytest.raises(TypeError, match="unexpected keyword argument 'qkv_biass'"):
        BLOCKS[family](kind="inline", qkv_biass=False)


@pytest.mark.parametrize("family", sorted(BLOCKS))
def test_options_reach_the_attention_layer_and_the_mlp(family):
    block = BLOCKS[family](kind="linear", mlp_ratio=2.0, qkv_bias=False, feature_map="exp", drop=0.25, drop_path=0.5)
    qkv = [m for name, m in block.named_modules() if name.endswith(("qkv", "kv", "q"))]
    assert qkv and all(m.bias is None for m in qkv)
    attn = block.attns[0] if family == "cswin" else block.attn
    assert attn.feature_map == "exp" and attn.residual is None  # linear: no residual by default
    assert block.mlp.fc1.out_features == 32 and block.drop_path.p == 0.5
    assert any(isinstance(m, nn.Dropout) and m.p == 0.25 for m in block.modules())


@pytest.mark.parametrize("family", ["swin", "cswin"])
def test_softmax_blocks_ignore_feature_map_and_residual(family):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        block = BLOCKS[family](kind="softmax", feature_map="relu", local_residual=True)
    assert not any(name.endswith("residual.0.weight") for name in block.state_dict())


def test_pvt_softmax_block_refuses_a_local_residual():
    with pytest.raises(ValueError, match="PVT softmax blocks .* take no local residual"):
        PVTBlock(16, 2, kind="softmax", sr_ratio=2, local_residual=True)
