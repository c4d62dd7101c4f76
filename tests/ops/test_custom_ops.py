"""The fused layer core as custom ops: opcheck, torch.compile without graph breaks, autograd limits.

On a GPU ``torch.compile`` traces into the Triton kernels instead (the ``triton_op`` pair
``inline_attn::kernels_forward`` / ``kernels_backward``): the compiled graphs hold their launches."""

from __future__ import annotations

import copy

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from inline_attn import create_model
from inline_attn.ops import cpu_kernel_available, inline_tokens, use_impl
from inline_attn.ops.tokens import residual_taps
from op_helpers import OpLog

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ["cpu", "triton"] if DEVICE == "cpu" else ["triton"]


def _args(backend, residual=True, requires_grad=True):
    b, h, w, heads, c, p = 2, 3, 4, 2, 16, 1
    qkv = torch.randn(b, p + h * w, 3 * c, device=DEVICE, requires_grad=requires_grad)
    q, k, v = qkv.chunk(3, dim=-1)
    taps = None
    if residual:
        taps = residual_taps(torch.randn(b, c, 3, 3, device=DEVICE), q.dtype).requires_grad_(requires_grad)
    return (q, k, v, taps, heads, (c // heads) ** -0.5, h, w, p, backend)


@pytest.mark.parametrize("residual", [True, False], ids=["res", "nores"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck_forward(backend, residual):
    assert backend != "cpu" or cpu_kernel_available()
    torch.library.opcheck(torch.ops.inline_attn.inline_forward.default, _args(backend, residual))


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck_backward(backend):
    q, k, v, taps, *rest = _args(backend, requires_grad=False)
    grad = torch.randn(q.shape, device=DEVICE)
    torch.library.opcheck(torch.ops.inline_attn.inline_backward.default, (q, k, v, taps, grad, *rest))


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck_with_float32_taps_beside_bf16_tokens(backend):
    # the autocast case: float32 taps from the predictor, bf16 q, k, v (fake rules give dw9 in float32)
    q, k, v, taps, *rest = _args(backend)
    q, k, v = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
    torch.library.opcheck(torch.ops.inline_attn.inline_forward.default, (q, k, v, taps, *rest))
    grad = torch.randn(q.shape, device=DEVICE, dtype=torch.bfloat16)
    args = (q.detach(), k.detach(), v.detach(), taps.detach(), grad, *rest)
    torch.library.opcheck(torch.ops.inline_attn.inline_backward.default, args)


def test_double_backward_raises_instead_of_dropping_terms():
    q, k, v, taps, *rest = _args("cpu" if DEVICE == "cpu" else "triton")
    out = torch.ops.inline_attn.inline_forward(q, k, v, taps, *rest)
    (gq,) = torch.autograd.grad(out.pow(2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="inline_backward"):
        gq.sum().backward()


class _GraphRecorder:
    """A torch.compile backend that keeps the forward and backward graphs' op targets."""

    def __init__(self):
        self.forward, self.backward = set(), set()

    def _keep(self, into):
        def compiler(gm, example_inputs):
            into.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
            return make_boxed_func(gm.forward)

        return compiler

    def backend(self):
        return aot_autograd(fw_compiler=self._keep(self.forward), bw_compiler=self._keep(self.backward))


# each family's smallest configuration, with InLine blocks
FAMILIES = {
    "inline_deit_tiny": (dict(depth=2, embed_dim=48, num_heads=3), 32),
    "inline_pvt_tiny": (dict(depths=(1, 1, 1, 1), embed_dims=(16, 32, 48, 64), num_heads=(1, 2, 3, 4)), 64),
    "inline_swin_tiny": (dict(depths=(1, 1, 1, 1), embed_dim=24, num_heads=(1, 2, 3, 3), window_size=4), 64),
    "inline_cswin_tiny": (dict(depths=(1, 1, 1, 1), embed_dim=16, num_heads=(1, 2, 2, 4)), 64),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_compile_fullgraph_keeps_the_fused_op_and_matches_eager(name):
    kw, res = FAMILIES[name]
    model = create_model(name, img_size=res, num_classes=5, **kw).to(DEVICE).eval()  # no dropout draws
    x = torch.randn(2, 3, res, res, device=DEVICE)
    ref = model(x)
    ref.square().sum().backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    rec = _GraphRecorder()
    compiled = torch.compile(model, backend=rec.backend(), fullgraph=True)
    out = compiled(x)
    out.square().sum().backward()
    # the graphs' ops in full on failure (pytest shortens a list's repr to its first few)
    fw, bw = (", ".join(sorted(graph)) for graph in (rec.forward, rec.backward))
    if DEVICE == "cuda":  # the triton_op pair: the compiled graphs launch the kernels themselves
        for graph, ops in ((rec.forward, fw), (rec.backward, bw)):
            assert "triton_kernel_wrapper_functional" in graph, f"{torch.__version__}: {ops}"
            assert not any(t.startswith("inline_attn.") for t in graph), f"{torch.__version__}: {ops}"
    else:
        assert "inline_attn.inline_forward.default" in rec.forward, fw
        assert "inline_attn.inline_backward.default" in rec.backward, bw
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for p, g in zip(model.parameters(), ref_grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-5)


def test_compile_inductor_matches_eager():
    # the default backend generates code around the opaque op (one family: inductor's C++ build
    # takes ~20 s per graph on these CPUs). Inductor fuses and reorders float32 reductions, so the
    # compiled model is held to the float64 model within twice the eager float32 model's own error.
    # cuDNN's TF32 is off: on an H100 the compiled graph's convolutions took a TF32
    # algorithm (error 3.7e-5 against eager's 7.8e-8, with or without the fused op); with TF32 off
    # it measured 4.2e-8.
    # one block: every op of the graph is there once, at half the build
    kw, res = FAMILIES["inline_deit_tiny"]
    torch.manual_seed(0)
    model = create_model("inline_deit_tiny", img_size=res, num_classes=5, **{**kw, "depth": 1}).to(DEVICE).eval()
    x = torch.randn(2, 3, res, res, device=DEVICE)
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        compiled = torch.compile(model, fullgraph=True)(x).double()
        eager = model(x).double()
        with use_impl("eager"):
            exact = copy.deepcopy(model).double()(x.double())
    eager_err = (eager - exact).abs().max().item()
    compiled_err = (compiled - exact).abs().max().item()
    assert compiled_err <= 2 * eager_err + 1e-6, (compiled_err, eager_err)


def test_compile_with_eager_impl_still_fullgraph():
    q, k, v, *_ = _args("cpu", requires_grad=False)

    def core(q, k, v):
        return inline_tokens(q, k, v, num_heads=2, feat_size=(3, 4), num_prefix_tokens=1)

    with use_impl("eager"):
        out = torch.compile(core, fullgraph=True, backend="aot_eager")(q, k, v)
    torch.testing.assert_close(out, core(q, k, v), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU autocast")
def test_fused_cpu_backend_under_bf16_autocast_trains():
    model = create_model("inline_deit_tiny", img_size=32, num_classes=5, depth=1, embed_dim=48, num_heads=3)
    x = torch.randn(2, 3, 32, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    out.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_double_backward_through_inline_tokens_raises(backend):
    # eager calls go through an autograd.Function over the same kernels: a second-order gradient
    # (even with an upstream gradient that does not require grad) must raise, not drop terms
    q, k, v, taps, *_ = _args(backend)
    out = inline_tokens(
        q,
        k,
        v,
        num_heads=2,
        feat_size=(3, 4),
        num_prefix_tokens=1,
        residual_weights=taps.detach().transpose(1, 2).reshape(2, 16, 3, 3),
        impl=backend,
    )
    with pytest.raises(RuntimeError, match="no derivative"):
        torch.autograd.grad(out, q, torch.ones_like(out), create_graph=True)
    # first-order gradients of the same call work
    (g,) = torch.autograd.grad(out.sum(), q)
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_residual_weights_stay_float32_beside_low_precision_tokens(backend, dtype):
    # Under autocast the predictor runs in float32 while q, k, v are bf16 / fp16. The taps reach the
    # kernels unrounded and their gradient comes back in float32 with no cast (one launch fewer on a
    # GPU), so the predictor's gradient keeps float32 precision.
    b, h, w, heads, c, p = 2, 3, 4, 2, 16, 1
    qkv = torch.randn(b, p + h * w, 3 * c, device=DEVICE).to(dtype).requires_grad_()
    weights = torch.randn(b, c, 3, 3, device=DEVICE, requires_grad=True)
    g = torch.randn(b, p + h * w, c, device=DEVICE).to(dtype)
    kw = dict(num_heads=heads, feat_size=(h, w), num_prefix_tokens=p)
    with OpLog() as log:  # a dispatch mode: the calls go through the custom ops
        out = inline_tokens(*qkv.chunk(3, dim=-1), residual_weights=weights, impl=backend, **kw)
        d_qkv, d_weights = torch.autograd.grad(out, (qkv, weights), g)
    assert out.dtype == dtype and d_qkv.dtype == dtype and d_weights.dtype == torch.float32
    (fwd_args,) = [args for name, args in log.calls if name == "inline_forward"]
    assert fwd_args[3] == ((b, 9, c), torch.float32)  # the taps
    casts = [args for name, args in log.calls if name == "_to_copy" and args[0][0] in ((b, 9, c), (b, c, 3, 3))]
    assert casts == []
    # against float64 on the same rounded tokens: the taps' gradient is float32 sums, not rounded to dtype
    qkv64 = qkv.detach().double().requires_grad_()
    w64 = weights.detach().double().requires_grad_()
    ref = inline_tokens(*qkv64.chunk(3, dim=-1), residual_weights=w64, impl="naive", **kw)
    want_qkv, want_weights = torch.autograd.grad(ref, (qkv64, w64), g.double())
    rel = ((d_weights.double() - want_weights).norm() / want_weights.norm()).item()
    assert rel < 1e-5, rel
    rel_out = ((out.double() - ref).norm() / ref.norm()).item()
    assert rel_out < 8e-3, rel_out  # the output's own rounding to bf16 / fp16
