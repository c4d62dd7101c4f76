"""The residual predictor inside the fused layer core, against the float64 reference.

In eager mode the layer core runs the predictor (token mean, the two grouped products, GELU) and
the core in one autograd node: on Triton an ``autograd.Function`` with one predictor kernel each
way, on the CPU the C++ op ``inline_attn::cpu_layer`` (forward, backward and autograd in C++).
Outputs and gradients (of x, q, k, v and the predictor's parameters) on awkward shapes: batch 1,
odd N, H != W, prefix tokens, head dims 24/32/48, strided views; Triton under its interpreter on a
machine without CUDA.
"""

from __future__ import annotations

import pytest
import torch

from inline_attn.layers import build_attention
from inline_attn.ops import use_impl
from inline_attn.ops.fused import triton as triton_core
from inline_attn.ops import inline_tokens
from inline_attn.ops.fused import cpu as cpu_kernel
from inline_attn.ops.predictor import predict_residual
from op_helpers import naive_inline_layer

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ["cpu", "triton"] if DEVICE == "cpu" else ["triton"]

# (B, N, heads, head_dim): B 17 spans two of the backward's sample blocks (16); N 75 and 70 span
# several of the forward's token tiles, the last one partial (32 tokens at 8 warps for a grid
# smaller than the interpreter's 4 "multiprocessors", 16 at 4 warps for one that fills them)
PREDICTOR_SHAPES = [(1, 7, 2, 24), (3, 20, 3, 32), (17, 5, 1, 48), (2, 9, 4, 8), (1, 75, 2, 32), (2, 70, 4, 32)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _params(c: int, d: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(c + d)
    w1 = torch.randn(c, d, 1, generator=g, dtype=dtype) * d**-0.5
    b1 = torch.randn(c, generator=g, dtype=dtype)
    w2 = torch.randn(9 * c, d, 1, generator=g, dtype=dtype) * d**-0.5
    b2 = torch.randn(9 * c, generator=g, dtype=dtype)
    return [p.to(DEVICE) for p in (w1, b1, w2, b2)]


def _reference(x, params, heads):
    """float64 taps [B, 9, C] by autograd through the predictor's reference math."""
    b, _, c = x.shape
    return predict_residual(x.mean(dim=1), *params, groups=heads).reshape(b, c, 9).transpose(1, 2)


def _ids(s):
    return "B{}_N{}_h{}_d{}".format(*s)


def _predictor_grads(ctx, dtaps, params, heads, n):
    """float64 (dctx / N, dw1, db1, dw2, db2) of the taps for their gradient dtaps [B, 9, C], by
    autograd through the reference math."""
    ctx64 = ctx.detach().double().requires_grad_()
    params64 = [p.detach().double().requires_grad_() for p in params]
    b, c = ctx.shape
    taps = predict_residual(ctx64, *params64, groups=heads).reshape(b, c, 9).transpose(1, 2)
    dctx, *dparams = torch.autograd.grad(taps, (ctx64, *params64), dtaps.double())
    return [dctx / n, *dparams]


def test_predictor_forward_tiles_take_more_warps_where_the_grid_leaves_multiprocessors_idle():
    # (tokens a tile, warps) for head dim, programs, multiprocessors: 64 elements a thread each way
    assert triton_core._predictor_tokens(32, 48, 132) == (32, 8)  # InLine-DeiT-T on an H200: 48 programs
    assert triton_core._predictor_tokens(24, 48, 132) == (32, 8)  # head dim 24 pads to 32
    assert triton_core._predictor_tokens(32, 768, 132) == (16, 4)  # Swin's 7x7 windows fill it
    assert triton_core._predictor_tokens(64, 48, 132) == (16, 8)
    assert triton_core._predictor_tokens(64, 768, 132) == (16, 8)  # head dim 64: 8 warps either way


@pytest.mark.parametrize("shape", PREDICTOR_SHAPES, ids=_ids)
def test_triton_predictor_forward_and_backward_match_float64(shape):
    b, n, heads, d = shape
    c = heads * d
    base = torch.randn(b, c, n + 1, dtype=torch.float64, device=DEVICE)
    x64 = base[:, :, 1:].transpose(1, 2).requires_grad_()  # a strided view: channel stride N + 1
    params64 = [p.requires_grad_() for p in _params(c, d)]
    ref = _reference(x64, params64, heads)
    g = torch.randn_like(ref)
    want = torch.autograd.grad(ref, (x64, *params64), g)
    x = x64.detach().float()
    params = [p.detach().float() for p in params64]
    with triton_core.record_launches() as log:
        ctx, taps = triton_core.predictor_forward_triton(x, *(p.reshape(p.shape[0], -1) for p in params), heads)
    tiles = -(-n // log[0].meta["BLOCK_T"])
    assert n < 70 or tiles >= 3, (log[0].meta, tiles)  # the loop over several tiles, the last one partial
    flat = [p.reshape(p.shape[0], -1) for p in params[:3]]
    dctx, *dparams = triton_core.predictor_backward_triton(ctx, g.float().contiguous(), *flat, n=n, num_heads=heads)
    assert ctx.dtype == taps.dtype == torch.float32 and taps.shape == (b, 9, c)
    assert _rel(ctx, x64.mean(1)) < 1e-6 and _rel(taps, ref) < 2e-6, (_rel(ctx, x64.mean(1)), _rel(taps, ref))
    # dx is dctx / N on every token
    errs = [_rel(dctx.unsqueeze(1).expand(b, n, c), want[0])]
    errs += [_rel(a.reshape(r.shape), r) for a, r in zip(dparams, want[1:])]
    print(f"triton {shape}: rel errs dx, dw1, db1, dw2, db2 {['%.1e' % e for e in errs]}")
    assert max(errs) < 1e-5, errs


# (B, (H, W), prefix, heads, head_dim)
LAYER_SHAPES = [(1, (5, 7), 1, 3, 24), (2, (4, 4), 0, 2, 32), (1, (3, 5), 2, 1, 48), (3, (4, 6), 1, 2, 64)]


@pytest.mark.parametrize("shape", LAYER_SHAPES, ids=lambda s: "B{}_{}x{}_p{}_h{}_d{}".format(s[0], *s[1], *s[2:]))
@pytest.mark.parametrize("backend", BACKENDS)
def test_inline_layer_with_fused_predictor_matches_float64(backend, shape):
    b, (h, w), p, heads, d = shape
    c = heads * d
    torch.manual_seed(0)
    layer = build_attention("inline", c, heads, num_prefix_tokens=p).to(DEVICE)
    layer64 = build_attention("inline", c, heads, num_prefix_tokens=p).to(DEVICE).double()
    layer64.load_state_dict(layer.state_dict())
    base = torch.randn(b, c, p + h * w, device=DEVICE, dtype=torch.float64)
    x64 = base.transpose(1, 2).requires_grad_()  # token-strided input
    x = x64.detach().float().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
    with use_impl(backend):
        out = layer(x, (h, w))
    ref = naive_inline_layer(layer64, x64, (h, w), p)
    assert _rel(out, ref) < 5e-6, _rel(out, ref)
    g = torch.randn_like(ref)
    got = torch.autograd.grad(out, (x, *layer.parameters()), g.float())
    want = torch.autograd.grad(ref, (x64, *layer64.parameters()), g)
    names = ["x"] + [n for n, _ in layer.named_parameters()]
    errs = {name: _rel(a, r) for name, a, r in zip(names, got, want)}
    print(backend, shape, {k: f"{e:.1e}" for k, e in errs.items()})
    assert max(errs.values()) < 2e-5, errs


needs_cpu_kernel = pytest.mark.skipif(
    DEVICE != "cpu" or not cpu_kernel.cpu_kernel_available(), reason="the C++ kernel (CPU, built)"
)
# (B, (H, W), prefix, heads, head_dim, weights as Conv1d [rows, d, 1] or flat [rows, d])
CPU_LAYER_SHAPES = [
    (1, (5, 7), 1, 3, 24, True),
    (17, (3, 3), 0, 2, 32, False),
    (2, (4, 6), 2, 1, 48, True),
    (3, (1, 1), 0, 4, 8, False),
    (300, (2, 3), 1, 2, 8, True),  # many samples: the predictor's loops split over threads
]


def _cpu_layer_id(s):
    return "B{}_{}x{}_p{}_h{}_d{}_conv{}".format(s[0], *s[1], *s[2:])


def _cpu_layer_inputs(b, hw, p, heads, d, conv, dtype):
    """x (token-strided) and q, k, v (views into one qkv tensor) [B, N, C], the predictor's
    parameters; float64 leaves cast to ``dtype``."""
    c, n = heads * d, p + hw[0] * hw[1]
    g = torch.Generator().manual_seed(b * 100 + n)
    x = torch.randn(b, c, n, generator=g, dtype=torch.float64).to(dtype).transpose(1, 2)
    q, k, v = torch.randn(b, n, 3 * c, generator=g, dtype=torch.float64).to(dtype).chunk(3, dim=-1)
    params = [(t if conv else t.squeeze(-1)).to(dtype) for t in _params(c, d)]
    return [t.requires_grad_() for t in (x, q, k, v)], [t.requires_grad_() for t in params]


def _cpu_layer_reference(x, q, k, v, params, heads, hw, p):
    """The layer core in float64 on the naive path: InLine + the predicted residual."""
    weights = predict_residual(x.mean(dim=1), *params, groups=heads)
    return inline_tokens(
        q, k, v, num_heads=heads, feat_size=hw, residual_weights=weights, num_prefix_tokens=p, impl="naive"
    )


@needs_cpu_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("shape", CPU_LAYER_SHAPES, ids=_cpu_layer_id)
def test_cpu_layer_op_matches_float64(shape, dtype):
    # the C++ layer op (predictor + core, its autograd in C++) on strided views against the naive
    # float64 path: the output and the gradients of x, q, k, v and the predictor's parameters
    b, hw, p, heads, d, conv = shape
    tokens, params = _cpu_layer_inputs(*shape, dtype)
    out = cpu_kernel.cpu_layer(*tokens, *params, heads, d**-0.5, *hw, p)
    tokens64 = [t.detach().double().requires_grad_() for t in tokens]
    params64 = [t.detach().double().requires_grad_() for t in params]
    ref = _cpu_layer_reference(*tokens64, params64, heads, hw, p)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    got = torch.autograd.grad(out, tokens + params, g.to(dtype))
    want = torch.autograd.grad(ref, tokens64 + params64, g)
    names = ["out", "x", "q", "k", "v", "w1", "b1", "w2", "b2"]
    errs = dict(zip(names, [_rel(out, ref)] + [_rel(a, r) for a, r in zip(got, want)]))
    print(dtype, shape, {k: f"{e:.1e}" for k, e in errs.items()})
    assert out.dtype == dtype and all(a.shape == t.shape and a.dtype == dtype for a, t in zip(got, tokens + params))
    assert max(errs.values()) < (2e-5 if dtype == torch.float32 else 1e-12), errs


@needs_cpu_kernel
def test_cpu_layer_op_in_bf16_is_the_float32_computation_rounded():
    # bf16 tokens (autocast's q, k, v) are computed in float32: the output and the tokens' gradients
    # are the float32 op's, rounded once; x and the predictor's (float32) gradients are the same
    shape = (2, (3, 4), 1, 2, 16, True)
    (x, q, k, v), params = _cpu_layer_inputs(*shape, torch.float32)
    q16, k16, v16 = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q16, k16, v16))
    args = (2, 16**-0.5, 3, 4, 1)
    out16 = cpu_kernel.cpu_layer(x, q16, k16, v16, *params, *args)
    out32 = cpu_kernel.cpu_layer(x, q32, k32, v32, *params, *args)
    g = torch.randn(out32.shape)
    got = torch.autograd.grad(out16, (x, q16, k16, v16, *params), g.bfloat16())
    want = torch.autograd.grad(out32, (x, q32, k32, v32, *params), g.bfloat16().float())
    assert out16.dtype == torch.bfloat16 and torch.equal(out16, out32.bfloat16())
    for a, r in zip(got, want):
        assert a.dtype == (torch.bfloat16 if r.shape == q.shape and a is not got[0] else torch.float32)
        assert torch.equal(a, r.to(a.dtype))


@needs_cpu_kernel
def test_cpu_layer_op_errors_and_edges():
    (x, q, k, v), params = _cpu_layer_inputs(1, (2, 3), 0, 2, 8, True, torch.float32)
    args = (2, 8**-0.5, 2, 3, 0)
    out = cpu_kernel.cpu_layer(x, q, k, v, *params, *args)
    with pytest.raises(RuntimeError, match="no derivative"):  # the C++ backward has no derivative
        torch.autograd.grad(out, q, torch.ones_like(out), create_graph=True)
    wrong_w2 = r"w2 must be \[9C, C/heads\(, 1\)\] \(1152 elements for C=16, num_heads=2\)"
    with pytest.raises(RuntimeError, match=wrong_w2):
        cpu_kernel.cpu_layer(x, q, k, v, params[0], params[1], params[2][:-1], params[3], *args)
    with pytest.raises(RuntimeError, match="x must be .* with q's shape"):
        cpu_kernel.cpu_layer(x[:, :-1], q, k, v, *params, *args)
    with pytest.raises(RuntimeError, match="N=6 must equal 0 \\+ 2\\*2"):
        cpu_kernel.cpu_layer(x, q, k, v, *params, 2, 0.1, 2, 2, 0)
    # no samples: an empty output, zero parameter gradients
    empty = [t.detach()[:0].requires_grad_() for t in (x, q, k, v)]
    out = cpu_kernel.cpu_layer(*empty, *params, *args)
    grads = torch.autograd.grad(out.sum(), params)
    assert out.shape == (0, 6, 16) and all(not gr.any() for gr in grads)


@pytest.mark.parametrize("residual", [True, False], ids=["residual", "no-residual"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_eager_layer_core_is_one_autograd_node(backend, residual):
    # the predictor runs inside the layer core's autograd node: no GELU, product or mean nodes; on
    # the CPU the node is the C++ op's own (the layer's, or the core's without a residual)
    layer = build_attention("inline", 48, 2, num_prefix_tokens=1, local_residual=residual).to(DEVICE)
    x = torch.randn(2, 1 + 12, 48, device=DEVICE, requires_grad=True)
    with use_impl(backend):
        out = layer(x, (3, 4))
    seen, todo = [], [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.append(node)
        todo.extend(f for f, _ in node.next_functions)
    names = [node.name() for node in seen]
    core = {
        ("cpu", True): "InlineLayer>",
        ("cpu", False): "InlineCore>",
        ("triton", True): "_TritonLayerCoreBackward",
        ("triton", False): "_InLineCoreBackward",
    }[backend, residual]
    assert sum(name.endswith(core) for name in names) == 1, names
    assert not any(k in name for name in names for k in ("Gelu", "Baddbmm", "Mean", "Bmm")), names


@pytest.mark.parametrize("backend", BACKENDS)
def test_inline_layer_under_bf16_autocast_within_twice_eager(backend):
    # the fused layer core under autocast (bf16 q, k, v; the predictor in float32): its error against
    # the float64 layer stays within ~2x that of the eager path under the same autocast
    torch.manual_seed(1)
    layer = build_attention("inline", 64, 2, num_prefix_tokens=1).to(DEVICE)
    layer64 = build_attention("inline", 64, 2, num_prefix_tokens=1).to(DEVICE).double()
    layer64.load_state_dict(layer.state_dict())
    x = torch.randn(2, 1 + 5 * 6, 64, device=DEVICE)
    x64 = x.double().requires_grad_()
    ref = naive_inline_layer(layer64, x64, (5, 6), 1)
    g = torch.randn_like(ref)
    want = torch.autograd.grad(ref, (x64, *layer64.parameters()), g)
    errs = {}
    for impl in (backend, "eager"):
        xi = x.clone().requires_grad_()
        with use_impl(impl), torch.autocast(DEVICE, dtype=torch.bfloat16):
            out = layer(xi, (5, 6))
        got = torch.autograd.grad(out.float(), (xi, *layer.parameters()), g.float())
        errs[impl] = [_rel(out, ref)] + [_rel(a, r) for a, r in zip(got, want)]
    print(f"{backend}: {errs[backend]}\neager: {errs['eager']}")
    for e_fused, e_eager in zip(errs[backend], errs["eager"]):
        assert e_fused <= 2 * e_eager + 1e-3, (e_fused, e_eager)  # 1e-3: below bf16's rounding of one value


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(x=torch.randn(2, 12, 16)), "x must have q's shape"),
        (dict(w1=torch.randn(16, 4, 1)), "predictor weights"),
        (dict(w2=torch.randn(16 * 8, 8, 1)), "predictor weights"),
    ],
    ids=["x-tokens", "w1-groups", "w2-rows"],
)
def test_layer_tokens_bad_input_is_a_clear_error(change, match):
    from inline_attn.ops.tokens import inline_layer_tokens

    q, k, v = torch.randn(2, 13, 48).chunk(3, dim=-1)
    args = dict(x=torch.randn(2, 13, 16), w1=torch.randn(16, 8, 1), w2=torch.randn(16 * 9, 8, 1))
    args.update(change)
    predictor = (args["w1"], torch.randn(16), args["w2"], torch.randn(16 * 9))
    with pytest.raises(ValueError, match=match):
        inline_layer_tokens(args["x"], q, k, v, predictor=predictor, num_heads=2, feat_size=(3, 4), num_prefix_tokens=1)


def test_predictor_backward_over_sample_blocks_matches_float64_in_the_chunks_it_chooses():
    # every program sums its head's gradient over its chunk of samples in blocks of 16: 16 samples
    # make one block (one launch), 100 and 201 (Swin's windows) 7 and 13 with a ragged last one,
    # which the interpreter's 4 multiprocessors leave in one chunk (its 20 (head, slot) programs
    # fill them) and a GPU splits into chunks merged by a second launch; a second run gives
    # bit-equal gradients (a fixed order, no atomics)
    heads, d, n = 2, 16, 5
    c = heads * d
    params = [p.float() for p in _params(c, d)]
    flat = [p.reshape(p.shape[0], -1) for p in params[:3]]
    for b in (16, 100, 201):
        ctx = torch.randn(b, c, device=DEVICE)
        dtaps = torch.randn(b, 9, c, device=DEVICE)
        with triton_core.record_launches() as log:
            got = triton_core.predictor_backward_triton(ctx, dtaps, *flat, n=n, num_heads=heads)
        (programs, chunks), *merge = [x.grid for x in log]
        assert log[0].kernel == "predictor_bwd" and programs == heads * 10
        assert merge == ([(heads * 10,)] if chunks > 1 else []) and (chunks == 1 or DEVICE == "cuda"), log
        want = _predictor_grads(ctx, dtaps, params, heads, n)
        errs = [_rel(a.reshape(r.shape), r) for a, r in zip(got, want)]
        assert max(errs) < 1e-5, (b, errs)
    again = triton_core.predictor_backward_triton(ctx, dtaps, *flat, n=n, num_heads=heads)
    assert all(torch.equal(a, r) for a, r in zip(again, got))


@pytest.mark.parametrize("chunks", [2, 3, 7])
def test_predictor_backward_over_sample_chunks_merges_in_order_matching_float64(chunks):
    # the samples split into chunks over a second grid dimension, the chunks' sums added in order
    # by a second launch: 201 samples are 13 blocks of 16 (3 chunks: 5 + 5 + 3 blocks, the last one
    # ragged); a second run gives bit-equal gradients
    heads, d, n, b = 2, 16, 5, 201
    c = heads * d
    params = [p.float() for p in _params(c, d)]
    flat = [p.reshape(p.shape[0], -1) for p in params[:3]]
    ctx = torch.randn(b, c, device=DEVICE)
    dtaps = torch.randn(b, 9, c, device=DEVICE)
    with triton_core.record_launches() as log:
        got = triton_core.predictor_backward_triton(ctx, dtaps, *flat, n=n, num_heads=heads, chunks=chunks)
    launched = [(x.kernel, x.grid) for x in log]
    assert launched == [("predictor_bwd", (heads * 10, chunks)), ("predictor_bwd_merge", (heads * 10,))]
    want = _predictor_grads(ctx, dtaps, params, heads, n)
    errs = [_rel(a.reshape(r.shape), r) for a, r in zip(got, want)]
    assert max(errs) < 1e-5, errs
    again = triton_core.predictor_backward_triton(ctx, dtaps, *flat, n=n, num_heads=heads, chunks=chunks)
    assert all(torch.equal(a, r) for a, r in zip(again, got))


def test_predictor_backward_chunks_fill_the_device_from_four_blocks():
    gpu = triton_core.DeviceLimits("H200", 132, 232_448)
    with triton_core.simulated_device(gpu, lambda *a: 0):
        device = torch.device("meta")  # planned as the simulated GPU
        # InLine-DeiT-T's layer: 128 samples are 4 blocks of 32, one a chunk (60 programs fill 240)
        assert triton_core._predictor_chunks(device, 60, 4) == 4
        # Swin-T's 7x7 windows at B 64: 4,096 windows, 128 blocks; 3 heads' 30 programs x 35 chunks
        assert triton_core._predictor_chunks(device, 30, 128) == 8 * 132 // 30
        assert triton_core._predictor_chunks(device, 30, 3) == 1  # a short chain stays one launch
