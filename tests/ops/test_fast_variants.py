"""The speed paths added for the benchmarks, against the naive reference (outputs and gradients).

- ``ops.local_residual`` (one grouped conv) vs ``naive_local_residual`` (nine taps) on V as the
  layers give it: a channels-last view into the qkv output;
- ``LocalResidual.predict`` (grouped 1x1 convs evaluated as batched matmuls) vs the module's
  Conv1d pipeline, the reference's form, and in float32 under autocast;
- the whole InLine layer vs a composition of naive ops (explicit N x N weights), float64, with a
  cls token and H != W; bf16 autocast; ``torch.compile(fullgraph=True)`` tracing.
"""

from __future__ import annotations

import pytest
import torch

from inline_attn.layers import build_attention
from inline_attn.layers.local_residual import LocalResidual
from inline_attn.ops import local_residual, naive_local_residual
from op_helpers import OpLog, naive_inline_layer

SHAPES = [(1, 5, 3, 7), (2, 24, 7, 7), (3, 6, 1, 9), (2, 9, 8, 5)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_local_residual_on_token_views_matches_naive_outputs_and_grads(shape):
    b, c, h, w = shape
    tokens = torch.randn(b, h * w, 3 * c, dtype=torch.float64, requires_grad=True)
    v = tokens[:, :, 2 * c :].reshape(b, h, w, c).permute(0, 3, 1, 2)  # channels-last view, as the layers
    wts = torch.randn(b, c, 3, 3, dtype=torch.float64, requires_grad=True)
    fast = local_residual(v, wts)
    ref = naive_local_residual(v.contiguous(), wts)
    print(f"max |conv - naive| {(fast - ref).abs().max().item():.3g}")
    torch.testing.assert_close(fast, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(ref)
    gf = torch.autograd.grad(fast, (tokens, wts), g)
    gr = torch.autograd.grad(naive_local_residual(v, wts), (tokens, wts), g)
    for a, r in zip(gf, gr):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dim,heads", [(12, 3), (24, 6), (10, 1)])
def test_predictor_matmul_form_matches_conv1d_pipeline(dim, heads):
    res = LocalResidual(dim, heads).double()
    ctx = torch.randn(5, dim, dtype=torch.float64, requires_grad=True)
    fast = res.predict(ctx)
    ref = torch.nn.Sequential.forward(res, ctx.unsqueeze(-1)).view(5, dim, 3, 3)  # the reference's convs
    torch.testing.assert_close(fast, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(ref)
    params = (ctx, *res.parameters())
    for a, r in zip(torch.autograd.grad(fast, params, g), torch.autograd.grad(ref, params, g)):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)


def test_predictor_under_autocast_runs_in_float32_without_casts():
    # the prediction is tiny; autocast would add a cast per input, weight and bias (and per gradient):
    # kernel launches a small layer's GPU step waits on. It runs in the parameters' float32 instead.
    res = LocalResidual(24, 3)
    ctx = torch.randn(4, 24, requires_grad=True)
    exact = res.predict(ctx)
    with OpLog() as ops:
        with torch.autocast("cpu", dtype=torch.bfloat16):  # backward outside it, as in training
            mixed = res.predict(ctx)
        mixed.sum().backward()
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, exact, rtol=0, atol=0)
    assert "_to_copy" not in ops.names and "baddbmm" in ops.names, ops.names


def test_predictor_gives_its_context_a_contiguous_gradient():
    # the context is the mean token: its gradient is broadcast over all N tokens of the layer input,
    # which on an H100 ran as an uncoalesced [B, N, C] sum (0.2 ms a step) when it came back transposed
    res = LocalResidual(24, 3)
    ctx = torch.randn(5, 24, requires_grad=True)
    seen = []
    context = ctx * 1.0  # a non-leaf, so the hook sees the gradient as autograd produced it
    context.register_hook(lambda g: seen.append(g.stride()))
    res.predict(context).square().sum().backward()
    assert seen == [(24, 1)]


@pytest.mark.parametrize(
    "b,feat,p,dim,heads",
    [(1, (7, 9), 1, 24, 3), (2, (4, 4), 0, 60, 2), (3, (3, 21), 0, 12, 3)],
    ids=["B1-7x9-cls", "B2-4x4-d30", "B3-3x21"],
)
def test_inline_layer_matches_naive_composition(b, feat, p, dim, heads):
    layer = build_attention("inline", dim, heads, num_prefix_tokens=p).double()
    x = torch.randn(b, p + feat[0] * feat[1], dim, dtype=torch.float64, requires_grad=True)
    out = layer(x, feat)
    ref = naive_inline_layer(layer, x, feat, p)
    print(f"max |layer - naive| {(out - ref).abs().max().item():.3g}")
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    params = (x, *layer.parameters())
    g = torch.randn_like(out)
    for a, r in zip(torch.autograd.grad(out, params, g), torch.autograd.grad(ref, params, g)):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_inline_layer_autocast_close_to_float64(dtype):
    layer = build_attention("inline", 48, 3, num_prefix_tokens=1)
    x = 4 * torch.randn(2, 1 + 9 * 11, 48) + 1
    with torch.autocast("cpu", dtype=dtype):
        y = layer(x, (9, 11))
    y.float().sum().backward()  # backward runs under the same casts
    assert torch.isfinite(y).all() and all(torch.isfinite(p.grad).all() for p in layer.parameters())
    with torch.no_grad():
        ref = layer.double()(x.double(), (9, 11))
    rel = ((y.double() - ref).norm() / ref.norm()).item()
    print(f"{dtype}: relative L2 error {rel:.3g}")
    assert rel < 8 * torch.finfo(dtype).eps


def test_inline_layer_compiles_without_graph_breaks():
    layer = build_attention("inline", 24, 3, num_prefix_tokens=1)
    x = torch.randn(2, 1 + 5 * 6, 24)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")  # dynamo tracing only: no codegen
    torch.testing.assert_close(compiled(x, (5, 6)), layer(x, (5, 6)))
