"""The one dispatch point of the InLine layer core: vocabulary, choice, reasons and bad input."""

from __future__ import annotations

import re
import warnings

import os

import pytest
import torch

import inline_attn.ops as ops
from inline_attn.layers import InLineAttention, LinearAttention, SoftmaxAttention, record_attention
from inline_attn.ops import IMPLS, attention, default_impl, dispatch, inline_tokens, use_impl, why_not_fused
from inline_attn.ops import tokens as tokens_mod


def _qkv(b=2, n=13, c=12, dtype=torch.float32, device="cpu"):
    return torch.randn(b, n, 3 * c, dtype=dtype, device=device).chunk(3, dim=-1)


KW = dict(num_heads=3, feat_size=(3, 4), num_prefix_tokens=1)


def _needs_the_interpreter(impl: str) -> None:
    """Triton runs CPU tensors only under its interpreter, which a process with CUDA does not choose
    (tests/conftest.py): such a test holds on the CPU test machines only."""
    if impl == "triton" and torch.cuda.is_available():
        pytest.skip("impl='triton' on CPU tensors needs Triton's interpreter; this process compiles for CUDA")


@pytest.fixture
def fused_calls(monkeypatch):
    calls = []
    for name in ("inline_core", "inline_layer_core"):  # the core alone, and with the layer's residual predictor
        real = getattr(tokens_mod, name)
        monkeypatch.setattr(tokens_mod, name, lambda *a, real=real: calls.append(a[-1]) or real(*a))
    return calls


def test_vocabulary():
    assert IMPLS == ("auto", "naive", "eager", "cpu", "triton")
    assert default_impl() == "auto"


@pytest.mark.parametrize("impl", IMPLS)
def test_every_impl_agrees_with_naive_on_cpu(impl, fused_calls):
    _needs_the_interpreter(impl)
    q, k, v = _qkv()
    taps = torch.randn(2, 12, 3, 3)
    out = inline_tokens(q, k, v, residual_weights=taps, impl=impl, **KW)
    ref = inline_tokens(q.double(), k.double(), v.double(), residual_weights=taps.double(), impl="naive", **KW)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    assert fused_calls == {"auto": ["cpu"], "cpu": ["cpu"], "triton": ["triton"]}.get(impl, [])


def test_auto_reasons():
    q, _, _ = _qkv()
    assert why_not_fused(q) is None
    assert "feature map 'relu'" in why_not_fused(q, "relu")
    assert why_not_fused(q, impl="eager") == "impl='eager' was asked for"
    with use_impl("naive"):
        assert why_not_fused(q) == "impl='naive' was asked for"
    assert why_not_fused(q.to("meta")) == "no fused kernel for meta tensors"


def test_auto_falls_back_when_the_cpu_kernel_cannot_be_built(monkeypatch, fused_calls):
    monkeypatch.setattr(dispatch.cpu_kernel, "cpu_kernel_available", lambda: False)
    monkeypatch.setattr(dispatch.cpu_kernel, "cpu_kernel_error", lambda: "RuntimeError: no g++")
    q, k, v = _qkv()
    assert "could not be built: RuntimeError: no g++" in why_not_fused(q)
    inline_tokens(q, k, v, **KW)
    assert fused_calls == []
    with pytest.raises(ValueError, match="could not be built"):
        inline_tokens(q, k, v, impl="cpu", **KW)


def test_use_impl_is_scoped_and_checked(fused_calls):
    q, k, v = _qkv()
    with use_impl("eager"):
        assert default_impl() == "eager"
        inline_tokens(q, k, v, **KW)
        inline_tokens(q, k, v, impl="cpu", **KW)  # an explicit impl wins over the default
    assert default_impl() == "auto" and fused_calls == ["cpu"]
    with pytest.raises(ValueError, match="unknown impl 'fast'"):
        with use_impl("fast"):
            pass


def test_env_var_sets_the_default(monkeypatch):
    monkeypatch.setenv("INLINE_ATTN_IMPL", "eager")
    assert dispatch._env_impl() == "eager"
    monkeypatch.setenv("INLINE_ATTN_IMPL", "fused")
    assert dispatch._env_impl() is None  # the import goes on; the first op that needs it says why
    monkeypatch.setitem(dispatch._state, "default", None)
    with pytest.raises(ValueError, match=r"INLINE_ATTN_IMPL='fused': expected one of \('auto'"):
        dispatch.default_impl()
    with use_impl("eager"):  # an explicit default still works
        assert dispatch.default_impl() == "eager"


def test_a_bad_env_impl_is_one_clear_line_not_a_traceback():
    import subprocess
    import sys

    env = {**os.environ, "INLINE_ATTN_IMPL": "bogus"}
    code = "import inline_attn, torch; m = inline_attn.create_model('inline_deit_tiny', depth=1)\n"
    code += "m(torch.zeros(1, 3, 32, 32))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 1 and "ValueError: INLINE_ATTN_IMPL='bogus': expected one of" in done.stderr
    done = subprocess.run([sys.executable, "-m", "inline_attn.cli", "list"], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and "inline_deit_tiny" in done.stdout  # nothing that computes: no error


def test_layer_impl_attribute_and_hooks(fused_calls):
    layer = InLineAttention(12, 3, num_prefix_tokens=1).eval()
    x = torch.randn(2, 13, 12)
    with torch.no_grad():
        fused = layer(x, (3, 4))
        layer.impl = "eager"
        eager = layer(x, (3, 4))
        layer.impl = None
        with record_attention(layer) as records:  # a hook takes the explicit-weights path
            hooked = layer(x, (3, 4))
    assert fused_calls == ["cpu"] and len(records) == 1
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(hooked, eager, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", [InLineAttention, LinearAttention])
@pytest.mark.parametrize("arg", ["mask", "bias"])
def test_non_softmax_layers_refuse_mask_and_bias(cls, arg):
    layer = cls(12, 3)
    x = torch.randn(2, 12, 12)
    with pytest.raises(ValueError, match="bias and mask apply to softmax attention only"):
        layer(x, (3, 4), **{arg: torch.zeros(1, 12, 12)})


def test_cuda_without_triton_warns_once_and_runs_eager(monkeypatch):
    # no CUDA on the test machine: check the decision on a stand-in tensor whose device is cuda
    class FakeCuda:
        device = torch.device("cuda")
        dtype = torch.float32

    monkeypatch.setattr(dispatch, "_triton_importable", lambda: False)
    monkeypatch.setitem(dispatch._state, "warned_triton", False)
    with pytest.warns(RuntimeWarning, match=r"pip install 'inline-attn\[gpu\]'"):
        chosen, reason = dispatch.choose(FakeCuda())
    assert chosen == "eager" and "triton is not installed" in reason
    with warnings.catch_warnings(record=True) as later:
        warnings.simplefilter("always")
        dispatch.choose(FakeCuda())
    assert not later  # once per process
    with pytest.raises(ValueError, match="triton is not installed"):
        dispatch.choose(FakeCuda(), impl="triton")


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda q, k, v: (q.tolist(), k, v), "q must be a torch.Tensor"),
        (lambda q, k, v: (q.long(), k.long(), v.long()), "floating-point dtype"),
        (lambda q, k, v: (q, k.double(), v), "share one dtype"),
        (lambda q, k, v: (q, k.to("meta"), v), "on one device"),
        (lambda q, k, v: (q, k[:, :5], v), "q's shape"),
        (lambda q, k, v: (q[0], k[0], v[0]), r"\[B, N, C\]"),
    ],
    ids=["list", "int64", "mixed-dtype", "meta-and-cpu", "shape", "rank"],
)
def test_bad_tensors_raise_value_error(make, match):
    q, k, v = make(*_qkv())
    with pytest.raises(ValueError, match=match):
        inline_tokens(q, k, v, **KW)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(num_heads=3.0), "num_heads must be an int"),
        (dict(num_heads=True), "num_heads must be an int"),
        (dict(num_heads=0), "positive multiple"),
        (dict(num_heads=5), "positive multiple"),
        (dict(impl="fast"), "unknown impl 'fast'"),
        (dict(feat_size=(3, 3)), "token count"),
    ],
)
def test_bad_arguments_raise_value_error(kw, match):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=match):
        inline_tokens(q, k, v, **{**KW, **kw})


def test_zero_channels_and_residual_checks():
    q = torch.randn(2, 13, 0)
    with pytest.raises(ValueError, match="C must be positive"):
        inline_tokens(q, q, q, **KW)
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="residual_weights must be"):
        inline_tokens(q, k, v, residual_weights=torch.randn(2, 12, 9), **KW)
    with pytest.raises(ValueError, match="residual_weights must be on"):
        inline_tokens(q, k, v, residual_weights=torch.randn(2, 12, 3, 3, device="meta"), **KW)


def test_explicit_impl_that_cannot_run_raises():
    q, k, v = _qkv(dtype=torch.float64)
    with pytest.raises(ValueError, match="impl='triton' takes float32, bfloat16 or float16"):
        inline_tokens(q, k, v, impl="triton", **KW)
    with pytest.raises(ValueError, match="feature map 'relu' is not fused"):
        inline_tokens(q, k, v, impl="cpu", feature_map="relu", **KW)
    with pytest.raises(ValueError, match="impl='cpu' runs CPU tensors"):
        dispatch.choose(q.to("meta"), impl="cpu")


@pytest.mark.parametrize("impl", ["auto", "cpu", "triton", "eager"])
def test_empty_batch_forward_and_backward(impl):
    _needs_the_interpreter(impl)
    q = torch.randn(0, 13, 12, requires_grad=True)
    taps = torch.randn(0, 12, 3, 3, requires_grad=True)
    out = inline_tokens(q, q, q, residual_weights=taps, impl=impl, **KW)
    assert out.shape == (0, 13, 12)
    out.sum().backward()
    assert q.grad.shape == q.shape and taps.grad.shape == taps.shape


def test_attention_impls_are_the_unfused_subset_of_impls():
    assert dispatch.ATTENTION_IMPLS == ("auto", "naive", "eager")
    assert set(dispatch.ATTENTION_IMPLS) | set(dispatch.FUSED_IMPLS) == set(IMPLS)
    assert [dispatch.attention_path(i) for i in IMPLS] == ["eager", "naive", "eager", "eager", "eager"]
    with use_impl("naive"):
        assert dispatch.attention_path(None) == "naive"
    q = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match=r"impl='cpu' is a fused kernel of the whole InLine layer core"):
        attention(q, q, q, impl="cpu")


@pytest.fixture
def naive_calls(monkeypatch):
    """Kinds that ran the per-head naive reference (:func:`inline_attn.ops.attention`'s naive path)."""
    calls = []
    real = ops.naive_attention
    monkeypatch.setattr(ops, "naive_attention", lambda *a, **kw: calls.append(kw["kind"]) or real(*a, **kw))
    return calls


@pytest.mark.parametrize("cls", [SoftmaxAttention, LinearAttention])
def test_layer_impl_is_honoured_by_softmax_and_linear_layers(cls, naive_calls):
    torch.manual_seed(0)
    layer = cls(12, 3, num_prefix_tokens=1, local_residual=True).eval()
    x = torch.randn(2, 13, 12)
    with torch.no_grad():
        eager = layer(x, (3, 4))
        assert naive_calls == []
        layer.impl = "naive"
        naive = layer(x, (3, 4))
        assert naive_calls == [layer.kind]
        layer.impl = None
        with use_impl("naive"):
            layer(x, (3, 4))
        assert naive_calls == [layer.kind] * 2
        layer.impl = "cpu"  # no fused kernel for these kinds: the eager path
        layer(x, (3, 4))
    assert naive_calls == [layer.kind] * 2
    torch.testing.assert_close(naive, eager, rtol=1e-5, atol=1e-6)


def test_layers_take_impl_at_construction():
    assert SoftmaxAttention(12, 3, impl="naive").impl == "naive"
    assert InLineAttention(12, 3).impl is None
    with pytest.raises(ValueError, match="unknown impl 'fast'"):
        InLineAttention(12, 3, impl="fast")


class _CudaLike(torch.Tensor):
    """CPU values that say they are on CUDA (no CUDA on the test machine): the host decision only."""

    @property
    def device(self):
        return torch.device("cuda")


# (id, q, feature_map, impl, patches, the reason's words or None for fused): every input class
# why_not_fused separates; patches name dispatch attributes and the value they take
_FUSED_TABLE = [
    ("auto-cpu", "cpu", None, None, {}, None),
    ("cpu-kernel", "cpu", None, "cpu", {}, None),
    ("triton-interpreter", "cpu", None, "triton", {"_triton_interpreting": True}, None),
    ("eager-asked", "cpu", None, "eager", {}, "impl='eager' was asked for"),
    ("naive-asked", "cpu", None, "naive", {}, "impl='naive' was asked for"),
    ("feature-map", "cpu", "relu", None, {}, "feature map 'relu' is not fused"),
    ("feature-map-cpu", "cpu", "relu", "cpu", {}, "feature map 'relu' is not fused"),
    ("feature-map-triton", "cpu", "relu", "triton", {}, "feature map 'relu' is not fused"),
    ("meta", "meta", None, None, {}, "no fused kernel for meta tensors"),
    ("cpu-impl-on-meta", "meta", None, "cpu", {}, "impl='cpu' runs CPU tensors, got meta"),
    ("triton-on-meta", "meta", None, "triton", {}, "impl='triton' runs CUDA tensors"),
    ("triton-float64", "float64", None, "triton", {}, "takes float32, bfloat16 or float16 tensors"),
    ("cpu-unbuilt", "cpu", None, "cpu", {"_cpu_available": False}, "could not be built"),
    ("auto-cpu-unbuilt", "cpu", None, None, {"_cpu_available": False}, "could not be built"),
    ("triton-not-interpreted", "cpu", None, "triton", {"_triton_interpreting": False}, "set TRITON_INTERPRET=1"),
    ("cuda-auto", "cuda", None, None, {"_triton_importable": True, "_triton_interpreting": False}, None),
    ("cuda-triton", "cuda", None, "triton", {"_triton_importable": True, "_triton_interpreting": False}, None),
    ("cuda-no-triton", "cuda", None, "triton", {"_triton_importable": False}, "triton is not installed"),
    (
        "cuda-interpreted",
        "cuda",
        None,
        "triton",
        {"_triton_importable": True, "_triton_interpreting": True},
        "this process runs Triton's interpreter",
    ),
    ("cuda-cpu-impl", "cuda", None, "cpu", {}, "impl='cpu' runs CPU tensors, got cuda"),
]


def _q_of(kind: str):
    if kind == "cuda":
        return torch.randn(2, 13, 12).as_subclass(_CudaLike)
    if kind == "float64":
        return torch.randn(2, 13, 12, dtype=torch.float64)
    return torch.randn(2, 13, 12, device=kind)


def _apply(monkeypatch, patches: dict) -> None:
    for name, value in patches.items():
        if name == "_cpu_available":
            monkeypatch.setattr(dispatch.cpu_kernel, "cpu_kernel_available", lambda v=value: v)
            monkeypatch.setattr(dispatch.cpu_kernel, "cpu_kernel_error", lambda: "RuntimeError: no g++")
        else:
            monkeypatch.setattr(dispatch, name, lambda v=value: v)
    monkeypatch.setitem(dispatch._state, "warned_triton", True)


@pytest.mark.parametrize("case", _FUSED_TABLE, ids=[c[0] for c in _FUSED_TABLE])
def test_why_not_fused_decision_table(case, monkeypatch, fused_calls):
    _, kind, feature_map, impl, patches, words = case
    _apply(monkeypatch, patches)
    q = _q_of(kind)
    reason = why_not_fused(q, feature_map, impl)
    assert (reason is None) == (words is None) and (words is None or words in reason), reason
    if kind in ("cuda", "meta"):
        # the host decision only (no CUDA here; meta tensors have no values): choose() answers as
        # why_not_fused does, or raises its reason
        if impl in ("cpu", "triton") and reason is not None:
            with pytest.raises(ValueError, match=re.escape(reason)):
                dispatch.choose(q, feature_map, impl)
        else:
            assert (dispatch.choose(q, feature_map, impl)[0] in ("cpu", "triton")) == (reason is None)
        return
    # "fused" means the call runs a fused kernel; an explicit fused impl that is refused raises the reason
    if reason is None:
        _needs_the_interpreter(impl)
    qq, k, v = _qkv(dtype=q.dtype, device=q.device)
    call = lambda: inline_tokens(qq, k, v, feature_map=feature_map, impl=impl, **KW)  # noqa: E731
    if reason is not None and impl in ("cpu", "triton"):
        with pytest.raises(ValueError, match=re.escape(reason)):
            call()
        return
    call()
    assert bool(fused_calls) == (reason is None)


@pytest.mark.parametrize(
    "q, impl, match",
    [
        ([[1.0]], None, "q must be a torch.Tensor, got list"),
        (torch.zeros(2, 13, 12, dtype=torch.long), None, "floating-point dtype, got torch.int64"),
        (torch.zeros(13, 12), None, r"q must be \[B, N, C\]"),
        (torch.zeros(2, 3, 13, 4, 1), "triton", r"or \[B, H, N, D\]"),
        (torch.zeros(2, 13, 12), "fused", "unknown impl 'fused'"),
    ],
    ids=["list", "long", "2-d", "5-d", "unknown-impl"],
)
def test_why_not_fused_refuses_what_no_path_takes(q, impl, match):
    with pytest.raises(ValueError, match=match):
        why_not_fused(q, impl=impl)


def test_the_gpu_fit_check_is_one_constant_under_compile(monkeypatch):
    # the CUDA-only fit check (planning launches on meta tensors, a cache keyed by kernels) is not
    # traceable: under torch.compile it must run once at trace time and enter the graph as a
    # constant, with no graph break (seen on an H200 when the mark sat on an lru_cache wrapper)
    from torch._dynamo.utils import counters

    from inline_attn.ops.fused import triton as launchers

    seen = []

    def unfit_reason(limits, heads, d, dtype):  # like the real one, nothing Dynamo may trace
        seen.append(d)
        torch._dynamo.graph_break()

    monkeypatch.setattr(launchers, "_cuda_limits", lambda index: launchers.DeviceLimits("GPU", 132, 232_448))
    monkeypatch.setattr(launchers, "_unfit_reason", unfit_reason)

    def fn(x):
        reason = launchers._cuda_unfit_reason(0, 3, x.shape[-1] // 3, x.dtype)
        return x + 1 if reason is None else x - 1

    torch._dynamo.reset()
    counters["graph_break"].clear()
    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    x = torch.zeros(2, 5, 12)
    for _ in range(2):
        assert torch.equal(compiled(x), x + 1)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert seen == [4]  # evaluated once, while tracing
