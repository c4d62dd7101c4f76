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
@pytest.mark.parametrize("letter", list("HEAVF"))
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
    with pytest.raises(ValueError, match="I/S/L/H/E/A/V/F/M"):
        parse_pattern("IXIS", (1, 1, 1, 1))
