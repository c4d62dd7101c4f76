"""Every family takes the other linear attentions through its pattern letters."""

from __future__ import annotations

import pytest
import torch

from inline_attn import create_model
from inline_attn.layers import TokenAttention
from inline_attn.models._helpers import PATTERN_KINDS, parse_pattern

SMALL = {
    "inline_deit_tiny": dict(img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=3),
    "inline_pvt_tiny": dict(img_size=64, embed_dims=(16, 16, 24, 24), num_heads=(1, 1, 2, 2), depths=(1, 1, 1, 1)),
    "inline_swin_tiny": dict(img_size=64, embed_dim=12, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 2), window_size=7),
    "inline_cswin_tiny": dict(img_size=64, embed_dim=16, depths=(1, 1, 1, 1)),
}


@pytest.mark.parametrize("name", list(SMALL))
@pytest.mark.parametrize("letter", list("HEAVFGPR"))
def test_family_builds_trains_with_each_linear_attention(name, letter):
    pattern = letter if "deit" in name else letter * 3 + "S"
    kind = PATTERN_KINDS[letter]
    m = create_model(name, num_classes=3, pattern=pattern, **SMALL[name])
    size = SMALL[name]["img_size"]
    y = m(torch.randn(2, 3, size, size - 8))  # H != W
    assert y.shape == (2, 3) and torch.isfinite(y).all()
    y.square().sum().backward()
    cores = [mod.core for mod in m.modules() if getattr(mod, "core", None) is not None]
    assert cores and all(c.kind == kind for c in cores)
    assert all(p.grad is not None for c in cores for p in c.parameters())
    if "deit" in name:
        assert isinstance(m.blocks[0].attn, TokenAttention)


def test_pattern_with_an_unknown_letter_lists_the_letters():
    with pytest.raises(ValueError, match="I/S/L/H/E/A/V/F/G/P/R/M"):
        parse_pattern("IXIS", (1, 1, 1, 1))


NEW_LETTERS = "GPR"  # the linear attentions researchers compare InLine with today (issue 25)


@pytest.mark.parametrize("name", list(SMALL))
@pytest.mark.parametrize("letter", list(NEW_LETTERS))
def test_features_only_backbone_with_each_new_attention(name, letter):
    """Multi-scale features at a size no stride divides (odd grids, H != W), with a gradient."""
    pattern = letter if "deit" in name else letter * 4
    m = create_model(name, pattern=pattern, features_only=True, **SMALL[name])
    x = torch.randn(1, 3, 52, 44)
    feats = m(x)
    assert len(feats) == len(m.feature_info) > 0
    for f, info in zip(feats, m.feature_info):
        assert f.shape[:2] == (1, info["num_chs"]) and torch.isfinite(f).all()
    sum(f.square().sum() for f in feats).backward()
    assert all(
        p.grad is not None
        for mod in m.modules()
        if getattr(mod, "core", None) is not None
        for p in mod.core.parameters()
    )


@pytest.mark.parametrize("letter", list(NEW_LETTERS))
def test_smallest_model_compiles_without_graph_breaks(letter):
    m = create_model("inline_deit_tiny", num_classes=3, pattern=letter, **SMALL["inline_deit_tiny"]).eval()
    x = torch.randn(1, 3, 32, 24)
    compiled = torch.compile(m, fullgraph=True, backend="eager")  # dynamo tracing only: no codegen
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x))
