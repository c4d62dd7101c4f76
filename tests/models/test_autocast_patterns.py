"""Every attention kind (every pattern letter) under CPU autocast: forward and backward run, stay
finite, and stay as close to float32 as plain PyTorch in the same precision (STYLE.md's rule from
flash-attention): the model's own path against its naive path (explicit weights, every matmul in the
autocast dtype), both against float32."""

from __future__ import annotations

import pytest
import torch

from inline_attn import create_model
from inline_attn.models._helpers import PATTERN_KINDS

# a 4 x 4 grid plus the cls token, three heads of 8; no stochastic depth (the runs must be one function)
TINY = dict(img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=3, num_classes=5, drop_path_rate=0.0)


def run(model, x, dtype):
    """(logits, gradient of the stem's weight) in float32, under autocast to ``dtype`` or without."""
    model.zero_grad()
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        logits = model(x)
    logits.float().square().mean().backward()
    return logits.float().detach(), model.patch_embed.proj.weight.grad.clone()


def rel(got, want) -> float:
    return ((got - want).norm() / want.norm()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("letter", sorted(PATTERN_KINDS))
def test_every_pattern_letter_under_autocast(letter, dtype):
    torch.manual_seed(0)
    model = create_model("inline_deit_tiny", pattern=letter, **TINY)
    x = torch.randn(2, 3, 16, 16)
    want = run(model, x, None)
    got = run(model, x, dtype)
    model.set_impl("naive")
    plain = run(model, x, dtype)
    eps = torch.finfo(dtype).eps
    for name, g, w, p in zip(("logits", "stem grad"), got, want, plain):
        err, plain_err = rel(g, w), rel(p, w)
        print(f"{letter} {dtype} {name}: |diff| / |float32| = {err:.2e}, naive path's {plain_err:.2e}")
        assert torch.isfinite(g).all() and torch.isfinite(p).all(), name
        assert err <= 2 * plain_err + 2 * eps, name
