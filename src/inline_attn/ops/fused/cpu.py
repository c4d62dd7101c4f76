"""The C++ CPU backend of the InLine layer core (``csrc/inline_cpu.cpp``), built on first use.

Eager PyTorch runs InLine attention as many memory-bound passes (means, centring, layout copies
for the batched products, the residual convolution and its layout copies); at small N (a 7x7
window, DeiT-T's 14x14 grid) those passes cost more than the arithmetic. The kernel does one task
per sample (or per head when samples are few) while its tokens are in cache and calls the BLAS
bundled with PyTorch for the two D x D products (docs/benchmarks.md measures it).

It registers three private ops (the layout described in the C++ file):

- ``inline_attn::cpu_forward`` and ``inline_attn::cpu_backward`` (float32 / float64): the core
  alone, the ``"cpu"`` backend of the public op (:mod:`inline_attn.ops.fused.op`), called through
  :func:`cpu_forward` / :func:`cpu_backward`, which copy inputs whose layout BLAS cannot read and
  upcast bf16 / fp16 to float32;
- ``inline_attn::cpu_layer`` (:data:`cpu_layer`): an eager layer's whole core with its residual
  predictor, forward and backward in C++ (its autograd is registered there: one C++ autograd node
  and no Python per layer step); any float dtypes and layouts;
- ``inline_attn::cpu_core`` (:data:`cpu_core`): the core alone (taps given, or none) the same way,
  for eager calls of :func:`inline_attn.ops.inline_tokens`.

It is compiled with g++ on first use (30-60 s once per install, cached; see :mod:`.cpu_build`, and
``inline-attn build-kernel`` to build it ahead). If the build fails the dispatch uses the eager
path and :func:`cpu_kernel_error` says why.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import cpu_build
from .._checks import cast
from ..compile_marks import constant_when_compiled

__all__ = ["cpu_backward", "cpu_core", "cpu_forward", "cpu_kernel_available", "cpu_kernel_error", "cpu_layer"]

_SOURCE = Path(__file__).with_name("csrc") / "inline_cpu.cpp"
_OP_NAME = "inline_attn::cpu_forward"
_state: dict = {"loaded": None, "error": None}

# The private ops' schemas live here, not in the C++ file, so that they exist before the build.
_LIB = torch.library.Library("inline_attn", "FRAGMENT")
_LIB.define(
    "cpu_forward(Tensor q, Tensor k, Tensor v, Tensor? w9, int num_heads, float scale, int H, int W, "
    "int num_prefix_tokens) -> Tensor"
)
_LIB.define(
    "cpu_backward(Tensor q, Tensor k, Tensor v, Tensor? w9, Tensor grad, int num_heads, float scale, int H, "
    "int W, int num_prefix_tokens) -> Tensor[]"
)
_LIB.define(
    "cpu_layer(Tensor x, Tensor q, Tensor k, Tensor v, Tensor w1, Tensor b1, Tensor w2, Tensor b2, int num_heads, "
    "float scale, int H, int W, int num_prefix_tokens) -> Tensor"
)
#: ``cpu_layer(x, q, k, v, w1, b1, w2, b2, num_heads, scale, H, W, num_prefix_tokens) -> O [B, N, C]``:
#: the layer core with its residual predictor (:func:`inline_attn.ops.fused.op.inline_layer_core`
#: documents the arguments) once the kernel is loaded (:func:`cpu_kernel_available`); the op itself,
#: so that a layer step calls no Python wrapper
cpu_layer = torch.ops.inline_attn.cpu_layer.default
_LIB.define(
    "cpu_core(Tensor q, Tensor k, Tensor v, Tensor? w9, int num_heads, float scale, int H, int W, "
    "int num_prefix_tokens) -> Tensor"
)
#: ``cpu_core(q, k, v, w9, num_heads, scale, H, W, num_prefix_tokens) -> O [B, N, C]``: the core
#: alone (:func:`inline_attn.ops.fused.op.inline_forward` documents the arguments) with its autograd
#: node in C++, as :data:`cpu_layer`
cpu_core = torch.ops.inline_attn.cpu_core.default


def _load() -> bool:
    if _state["loaded"] is None:
        _state["loaded"] = cpu_build.load_cpu_kernel(_SOURCE, op_name=_OP_NAME)
        _state["error"] = cpu_build.cpu_kernel_error()
    return _state["loaded"]


@constant_when_compiled
def cpu_kernel_available() -> bool:
    """True when the kernel is built (building it on the first call). Under ``torch.compile`` the
    answer is taken once at trace time (the build runs outside the graph)."""
    return _load()


def cpu_kernel_error() -> str | None:
    """Why the kernel could not be built, or None."""
    return _state["error"]


def _blas_layout(t: torch.Tensor) -> torch.Tensor:
    """t [B, N, C] as the kernel reads it: unit channel stride and non-overlapping rows (a token
    stride of at least C), else a contiguous copy (expanded or overlapping views)."""
    b, n, c = t.shape
    if (c <= 1 or t.stride(2) == 1) and (n <= 1 or t.stride(1) >= c):
        return t
    return t.contiguous()


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()  # a no-op contiguous() still costs a dispatch


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def cpu_forward(q, k, v, w9, num_heads: int, scale: float, h: int, w: int, p: int) -> torch.Tensor:
    """The C++ forward on any float CPU tensors: [B, N, C] (+ w9 [B, 9, C]) -> [B, N, C] in q's
    dtype; bf16 / fp16 inputs are computed in float32."""
    if not _load():
        raise RuntimeError(f"the fused CPU kernel is not available: {_state['error']}")
    dtype = q.dtype
    if q.numel() == 0:
        return q.new_empty(q.shape)
    ct = _compute_dtype(dtype)
    q, k, v = (_blas_layout(cast(t, ct)) for t in (q, k, v))
    w9 = _contiguous(cast(w9, ct)) if w9 is not None else None
    return cast(torch.ops.inline_attn.cpu_forward(q, k, v, w9, num_heads, scale, h, w, p), dtype)


def cpu_backward(q, k, v, w9, grad, num_heads: int, scale: float, h: int, w: int, p: int):
    """The C++ backward: (dq, dk, dv, dw9) in the inputs' dtypes (dw9 empty without a residual)."""
    if not _load():
        raise RuntimeError(f"the fused CPU kernel is not available: {_state['error']}")
    dtype = q.dtype
    if q.numel() == 0:
        dw = torch.zeros_like(w9) if w9 is not None else q.new_empty(0)
        return q.new_zeros(q.shape), q.new_zeros(q.shape), q.new_zeros(q.shape), dw
    ct = _compute_dtype(dtype)
    q, k, v, grad = (_blas_layout(cast(t, ct)) for t in (q, k, v, grad))
    w9c = _contiguous(cast(w9, ct)) if w9 is not None else None
    dq, dk, dv, dw = torch.ops.inline_attn.cpu_backward(q, k, v, w9c, grad, num_heads, scale, h, w, p)
    return cast(dq, dtype), cast(dk, dtype), cast(dv, dtype), cast(dw, w9.dtype if w9 is not None else dtype)
