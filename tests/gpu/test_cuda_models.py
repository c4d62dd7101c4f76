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


def _model(name, res=None):
    kw, family_res = FAMILIES[name]
    res = res or family_res
    torch.manual_seed(0)
    model = create_model(name, img_size=res, num_classes=10, **kw).cuda().eval()
    return model, torch.randn(4, 3, res, res, device="cuda")


def _rel(a, b):
    """Relative error of a against b; 0 when both are exactly zero (a parameter whose gradient is zero
    on both paths: the last DeiT block's residual predictor, whose grid tokens the cls-token head
    never reads), inf when only b is."""
    diff, ref = (a.double() - b.double()).norm().item(), b.double().norm().item()
    if ref == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / ref


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
        grads[impl] = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    assert _rel(outs["triton"], outs["eager"]) < 1e-4
    assert grads["triton"].keys() == grads["eager"].keys()
    for n, g in grads["eager"].items():
        assert _rel(grads["triton"][n], g) < 1e-3, n


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
    # eval mode: no dropout draws, so compiled and eager see the same model. 224 px: every stage's
    # grid is a multiple of the window (at 112 px the last stage pads 7 -> 8, a graph inductor takes
    # minutes to build on CUDA)
    model, x = _model(name, res=224)
    # static shapes: an earlier test in the process may have compiled this forward's code at another
    # size, and dynamo would then recompile it with symbolic sizes (minutes of sympy on Swin's padding)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = model(x)
        out = compiled(x)
    assert _rel(out, ref) < 2e-2
    out.float().square().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_compiled_training_step_has_no_graph_break_on_the_triton_path():
    # the CUDA-only part of the dispatch (whether the kernels fit the GPU's shared memory) is traced
    # here, and nowhere on the CPU test machines. Train mode with drop path, bf16 autocast, as trained
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    kw, res = FAMILIES["inline_deit_tiny"]
    model = create_model("inline_deit_tiny", img_size=res, num_classes=10, drop_path_rate=0.1, **kw).cuda().train()
    x = torch.randn(4, 3, res, res, device="cuda")

    def step(x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return model(x)

    torch._dynamo.reset()
    counters["graph_break"].clear()
    compiled = torch.compile(step, backend="aot_eager")
    frames = counters["stats"]["unique_graphs"]
    for _ in range(2):  # the second step reuses the first one's graph
        model.zero_grad(set_to_none=True)
        compiled(x).float().square().mean().backward()
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] - frames == 1
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
