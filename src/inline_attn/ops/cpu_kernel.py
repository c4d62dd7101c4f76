"""The fused CPU kernel of the InLine layer core (``csrc/inline_cpu.cpp``), built on first use.

Eager PyTorch runs InLine attention as ~15 memory-bound passes (means, centring, layout copies for
the batched products, the residual convolution and its layout copies); at small N (a 7x7 window,
DeiT-T's 14x14 grid) those passes cost more than the arithmetic. The kernel does one task per
sample (or per head when samples are few) while its tokens are in cache and calls the BLAS bundled
with PyTorch for the two D x D products (docs/benchmarks.md measures it against the eager path).

A forward and a backward kernel form one autograd node (first-order gradients; the backward
recomputes the D x D product instead of saving it). :func:`inline_attn.ops.inline_tokens` uses them
on float32 / float64 CPU tensors outside autocast and ``torch.compile``, and the eager composition
otherwise. It is compiled with ``torch.utils.cpp_extension`` (g++ and ninja,
~15 s once; cached under ``~/.cache/torch_extensions``). If the build fails the eager path is used
and a warning says why. ``INLINE_ATTN_CPU_KERNEL=0`` (or :func:`use_cpu_kernel`) turns it off,
e.g. to compare the two paths.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import warnings
from pathlib import Path

import torch
from torch.utils.flop_counter import register_flop_formula

__all__ = ["cpu_kernel_available", "cpu_kernel_enabled", "inline_forward_cpu", "use_cpu_kernel"]

_SOURCE = Path(__file__).with_name("csrc") / "inline_cpu.cpp"
_state: dict = {"loaded": None, "error": None, "enabled": os.environ.get("INLINE_ATTN_CPU_KERNEL", "1") != "0"}


def _cpu_tag() -> str:
    # -march=native code must not be reused on a CPU with other instruction sets: the build's
    # name carries a hash of the CPU's feature flags.
    flags = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags += line
                break
    except OSError:
        pass
    return hashlib.sha1(flags.encode()).hexdigest()[:10]


def _load() -> bool:
    if _state["loaded"] is not None:
        return _state["loaded"]
    try:
        from torch.utils.cpp_extension import load

        load(
            name=f"inline_attn_cpu_{_cpu_tag()}",
            sources=[str(_SOURCE)],
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            verbose=False,
        )
        _state["loaded"] = torch._C._dispatch_has_kernel_for_dispatch_key(_OP_NAME, "CPU")
    except Exception as exc:  # no compiler, no ninja, a read-only cache: fall back to eager
        _state["loaded"], _state["error"] = False, f"{type(exc).__name__}: {exc}"
        warnings.warn(
            f"inline-attn: the fused CPU kernel could not be built ({_state['error'][:300]}); "
            "using the eager path (correct, slower at small N)",
            RuntimeWarning,
            stacklevel=3,
        )
    return _state["loaded"]


# The op's schema lives here, not in the C++ file, so that FlopCounterMode (which copies the
# registry when it is created) and torch.compile's fake tensors know it before the kernel is built.
_OP_NAME = "inline_attn::inline_forward"
_LIB = torch.library.Library("inline_attn", "DEF")
_LIB.define(
    "inline_forward(Tensor q, Tensor k, Tensor v, Tensor? w9, int num_heads, float scale, int H, int W, "
    "int num_prefix_tokens) -> Tensor"
)
_LIB.define(
    "inline_backward(Tensor q, Tensor k, Tensor v, Tensor? w9, Tensor grad, int num_heads, float scale, int H, "
    "int W, int num_prefix_tokens) -> Tensor[]"
)


@torch.library.register_fake(_OP_NAME)
def _fake(q, k, v, w9, num_heads, scale, h, w, p):
    return q.new_empty(q.shape)


@torch.library.register_fake("inline_attn::inline_backward")
def _fake_backward(q, k, v, w9, grad, num_heads, scale, h, w, p):
    dw = q.new_empty(w9.shape) if w9 is not None else q.new_empty(0)
    return [q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape), dw]


@register_flop_formula(torch.ops.inline_attn.inline_forward)
def _flops(q_shape, k_shape, v_shape, w9_shape, num_heads, scale, h, w, p, *args, out_shape=None, **kwargs):
    """Counted like the eager path: the two d x d products of every head (2 N d^2 MACs per head)
    and the residual as a 3x3 depthwise convolution (9 MACs per grid token and channel); means
    and sums are not counted (as in eager)."""
    b, n, c = q_shape
    macs = 2 * b * n * c * (c // num_heads)
    if w9_shape is not None:
        macs += 9 * b * h * w * c
    return 2 * macs


@register_flop_formula(torch.ops.inline_attn.inline_backward)
def _flops_backward(q_shape, k_shape, v_shape, w9_shape, g_shape, num_heads, scale, h, w, p, *args,
                    out_shape=None, **kwargs):
    """The kernel's own work: five d x d products per head (M recomputed, dM, dQ, dK, dV) and the
    residual's two transposed 3x3 passes (dV and dw)."""
    b, n, c = q_shape
    macs = 5 * b * n * c * (c // num_heads)
    if w9_shape is not None:
        macs += 18 * b * h * w * c
    return 2 * macs


def cpu_kernel_available() -> bool:
    """True when the kernel is built (building it on the first call)."""
    return _load()


def cpu_kernel_enabled() -> bool:
    """True when the kernel is switched on (``INLINE_ATTN_CPU_KERNEL`` / :func:`use_cpu_kernel`)."""
    return _state["enabled"]


@contextlib.contextmanager
def use_cpu_kernel(enabled: bool):
    """Context manager switching the fused CPU kernel on or off (restores the previous state)."""
    previous = _state["enabled"]
    _state["enabled"] = bool(enabled)
    try:
        yield
    finally:
        _state["enabled"] = previous


class _InLineCPU(torch.autograd.Function):
    """The kernel's forward and backward as one autograd node (M is recomputed in the backward)."""

    @staticmethod
    def forward(ctx, q, k, v, w9, num_heads, scale, h, w, p):
        ctx.save_for_backward(q, k, v, w9)
        ctx.args = (num_heads, scale, h, w, p)
        return torch.ops.inline_attn.inline_forward(q, k, v, w9, num_heads, scale, h, w, p)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        q, k, v, w9 = ctx.saved_tensors
        if grad.stride(-1) != 1:
            grad = grad.contiguous()
        dq, dk, dv, dw = torch.ops.inline_attn.inline_backward(q, k, v, w9, grad, *ctx.args)
        return dq, dk, dv, (dw if w9 is not None else None), None, None, None, None, None


def inline_forward_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weights: torch.Tensor | None,
    *,
    num_heads: int,
    scale: float,
    feat_size: tuple[int, int],
    num_prefix_tokens: int,
) -> torch.Tensor:
    """Call the kernel (inputs already validated by :func:`inline_attn.ops.inline_tokens`).

    q, k, v: [B, N, C] with unit channel stride; weights: [B, C, 3, 3] or None -> [B, N, C].
    Differentiable (first order) in q, k, v and weights.
    """
    if not _load():
        raise RuntimeError(f"the fused CPU kernel is not available: {_state['error']}")
    w9 = None
    if weights is not None:
        b, c = weights.shape[:2]
        w9 = weights.reshape(b, c, 9).transpose(1, 2).contiguous()  # [B, 9, C]: taps over channels
    h, w = feat_size
    return _InLineCPU.apply(q, k, v, w9, num_heads, float(scale), h, w, num_prefix_tokens)
