"""One InLine layer step on the Triton kernels (``layer_forward_triton`` / ``layer_backward_triton``,
the layer core's autograd.Function) against the float64 reference, on both of its paths: the
planned one (the predictor's and the core's single launches each way) and the launchers' (when
the core's reductions are split over token chunks); and with parameters that are not fp32.

Under Triton's interpreter on a machine without CUDA. test_fused_predictor.py tests the layers
built on it; test_launch_plans.py what is planned.
"""

from __future__ import annotations

import pytest
import torch

from inline_attn.ops import inline_tokens
from inline_attn.ops.fused import op
from inline_attn.ops.fused import triton as triton_core
from inline_attn.ops.predictor import predict_residual

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
B, (H, W), P, HEADS, D = 2, (5, 8), 1, 2, 16  # 41 tokens: three 16-row tiles, which the split launch splits


def _inputs(conv: bool = True):
    """float64 leaves: x (token-strided) and q, k, v (views of one projection) [B, N, C], and the
    predictor's parameters (Conv1d weights [rows, d, 1], or flat [rows, d])."""
    c, n = HEADS * D, P + H * W
    x = torch.randn(B, c, n, dtype=torch.float64, device=DEVICE).transpose(1, 2)
    q, k, v = torch.randn(B, n, 3 * c, dtype=torch.float64, device=DEVICE).chunk(3, dim=-1)
    shapes = [(c, D, 1), (c,), (9 * c, D, 1), (9 * c,)]
    params = [0.3 * torch.randn(s, dtype=torch.float64, device=DEVICE) for s in shapes]
    params = [t if conv or t.dim() == 1 else t.squeeze(-1) for t in params]
    return [t.requires_grad_() for t in (x, q, k, v, *params)]


def _step(tensors, dtype, backend: str):
    """The layer core's output and the gradients of all its inputs, on ``tensors`` cast to ``dtype``."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in tensors]
    x, q, k, v, *params = leaves
    if backend == "naive":
        weights = predict_residual(x.mean(dim=1), *params, groups=HEADS)
        kw = dict(num_heads=HEADS, feat_size=(H, W), num_prefix_tokens=P, residual_weights=weights)
        out = inline_tokens(q, k, v, impl="naive", **kw)
    else:
        out = op.inline_layer_core(x, q, k, v, *params, HEADS, D**-0.5, H, W, P, "triton")
    g = torch.linspace(-1, 1, out.numel(), dtype=torch.float64, device=DEVICE).view(out.shape)
    return out, torch.autograd.grad(out, leaves, g.to(out.dtype))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@pytest.fixture
def split_core(monkeypatch):
    """The core's reductions split in two chunks of 16-row tiles: the step takes the launchers."""
    monkeypatch.setattr(triton_core, "_split", lambda *args: 2)
    with triton_core.forced_tiling(16, 2):
        yield


@pytest.mark.parametrize("path", ["planned", "launchers"])
def test_layer_step_matches_float64_on_both_paths(path, request):
    if path == "launchers":
        request.getfixturevalue("split_core")
    tensors = _inputs()
    with triton_core.record_launches() as log:
        out, grads = _step(tensors, torch.float32, "triton")
    kernels = [x.kernel for x in log]
    if path == "launchers":
        assert "inline_fwd_partial" in kernels and "inline_bwd_partial" in kernels, kernels
    else:
        assert kernels == ["predictor_fwd", "inline_fwd_resident", "inline_bwd_stream", "predictor_bwd"], kernels
    ref, want = _step(tensors, torch.float64, "naive")
    assert out.dtype == torch.float32 and _rel(out, ref) < 5e-6, _rel(out, ref)
    errs = {name: _rel(a, r) for name, a, r in zip(["x", "q", "k", "v", "w1", "b1", "w2", "b2"], grads, want)}
    assert max(errs.values()) < 2e-5, errs


def test_layer_step_in_bfloat16_is_the_float32_step_rounded():
    # bf16 parameters (flat weights [rows, d]) and activations: the predictor runs in fp32 on fp32
    # copies, and each gradient comes back in its input's dtype and shape
    tensors = [t.detach().to(torch.bfloat16).double().requires_grad_() for t in _inputs(conv=False)]
    out, grads = _step(tensors, torch.bfloat16, "triton")
    ref, want = _step(tensors, torch.float32, "triton")
    assert out.dtype == torch.bfloat16 and _rel(out, ref) < 1e-2, _rel(out, ref)
    for t, got, exp in zip(tensors, grads, want):
        assert got.dtype == torch.bfloat16 and got.shape == t.shape
        assert _rel(got, exp) < 2e-2, _rel(got, exp)
