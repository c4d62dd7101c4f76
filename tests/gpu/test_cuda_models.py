"""Whole models on a CUDA device: the Triton path against the eager path, under autocast and compile.

Runs where CUDA is present (``make gpu-check`` runs it); on the CPU test machines every test here
is skipped: the Triton kernels themselves are tested there under the interpreter
(tests/ops/test_triton.py).
"""

from __future__ import annotations

import pytest
import torch

from inline_attn import create_model
from inline_attn.ops import use_impl, why_not_fused

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

FAMILIES = {
    "inline_deit_tiny": (dict(depth=2, embed_dim=96, num_heads=3), 64),
    "inline_pvt_tiny": (dict(depths=(1, 1, 1, 1)), 96),
    "inline_swin_tiny": (dict(depths=(1, 1, 2, 1), window_size=7), 112),
    "inline_cswin_tiny": (dict(depths=(1, 1, 2, 1)), 96),
}


def _model(name):
    kw, res = FAMILIES[name]
    torch.manual_seed(0)
    model = create_model(name, img_size=res, num_classes=10, **kw).cuda().eval()
    return model, torch.randn(4, 3, res, res, device="cuda")


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_triton_matches_eager_float32(name):
    model, x = _model(name)
    assert why_not_fused(x.new_empty(1, 1, 8)) is None  # CUDA + triton: the fused path is taken
    outs, grads = {}, {}
    for impl in ("triton", "eager"):
        model.zero_grad()
        with use_impl(impl):
            out = model(x)
        out.square().sum().backward()
        outs[impl] = out.detach()
        grads[impl] = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    assert _rel(outs["triton"], outs["eager"]) < 1e-4
    for a, b in zip(grads["triton"], grads["eager"]):
        assert _rel(a, b) < 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_autocast_finite_and_close_to_float32(name, dtype):
    model, x = _model(name)
    ref = model(x).detach()
    with torch.autocast("cuda", dtype=dtype):
        out = model(x)
    out.float().square().sum().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    # the error of the whole model in low precision: a few roundings of its dtype per layer
    assert _rel(out, ref) < 0.05, _rel(out, ref)


@pytest.mark.parametrize("name", ["inline_swin_tiny"])
def test_compile_inductor_bf16_training_step_matches_eager(name):
    model, x = _model(name)  # eval mode: no dropout draws, so compiled and eager see the same model
    compiled = torch.compile(model, fullgraph=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = model(x)
        out = compiled(x)
    assert _rel(out, ref) < 2e-2
    out.float().square().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
