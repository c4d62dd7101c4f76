"""Which implementation computes the InLine layer core: one vocabulary, one decision, one reason.

``impl`` takes one of :data:`IMPLS`:

- ``"auto"``: the fused op where it applies (``"cpu"`` on CPU tensors, ``"triton"`` on CUDA
  tensors), else ``"eager"``; :func:`why_not_fused` says why it was not taken;
- ``"naive"``: explicit N x N weights, written to mirror the equations (the reference);
- ``"eager"``: linear-time PyTorch ops (the authors' order of operations);
- ``"cpu"``: the C++ kernel (CPU tensors; float32 / float64, bf16 / fp16 computed in float32);
- ``"triton"``: the Triton kernels (CUDA tensors; CPU tensors under Triton's interpreter).

An explicit ``"cpu"`` / ``"triton"`` is honoured on any tensors it can run, and raises
``ValueError`` (naming what it needs) on tensors it cannot. The process default, used when a layer
passes ``impl=None``, is ``"auto"``, or ``INLINE_ATTN_IMPL`` from the environment, or the value set
by the :func:`use_impl` context manager.

Where each value applies: the fused impls compute InLine's whole layer core only
(:func:`inline_attn.ops.inline_tokens`). Every other attention (softmax, vanilla linear, the other
linear attentions, and InLine on [B, H, N, D] tensors through :func:`inline_attn.ops.attention`)
has two paths, :data:`ATTENTION_IMPLS`; :func:`attention_path` maps a layer's ``impl`` onto them
(``"naive"`` stays naive, anything else is eager).
"""

from __future__ import annotations

import contextlib
import os
import warnings

import torch

from ._checks import check_feat_size, check_num_heads
from .compile_marks import constant_when_compiled, exporting
from .feature_maps import get_feature_map
from .fused import cpu as cpu_kernel
from .fused import triton as triton_launchers  # imports no triton: the launchers' checks only

IMPLS = ("auto", "naive", "eager", "cpu", "triton")
FUSED_IMPLS = ("cpu", "triton")
#: the impls of :func:`inline_attn.ops.attention` (per-head attention of every kind): no fused kernel there
ATTENTION_IMPLS = tuple(i for i in IMPLS if i not in FUSED_IMPLS)
_TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _env_impl() -> str | None:
    """``$INLINE_ATTN_IMPL`` (default "auto"), None when it names no impl: the import goes on, and
    the first op that needs the default says what is wrong (:func:`default_impl`)."""
    value = os.environ.get("INLINE_ATTN_IMPL", "auto")
    return value if value in IMPLS else None


_state = {"default": _env_impl(), "warned_triton": False}


def check_impl(impl: str) -> str:
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}: expected one of {IMPLS}")
    return impl


def attention_path(impl: str | None, kind: str = "inline") -> str:
    """``"naive"`` or ``"eager"``: the path an attention without a fused kernel takes for a layer's
    ``impl`` (None = :func:`default_impl`); "auto", "cpu" and "triton" mean eager there.

    Softmax attention takes the naive path (its explicit weights: SDPA's math form) while
    ``torch.onnx.export`` traces: the exporter decomposes SDPA by replaying the CPU flash kernel's
    output strides, and views traced on them fail there.
    """
    if check_impl(default_impl() if impl is None else impl) == "naive":
        return "naive"
    return "naive" if kind == "softmax" and in_onnx_export() else "eager"


def residual_path(impl: str | None) -> str:
    """``"naive"`` (nine shifted multiply-adds) or ``"eager"`` (one grouped convolution): the form
    of the local residual outside the fused op, for a layer's ``impl`` (as :func:`attention_path`).

    While a model is exported (``torch.export``, ``torch.onnx.export``) the multiply-adds: the
    convolution folds the batch into its groups, and ONNX's Conv takes a static group count, so a
    program with a dynamic batch could not become ONNX.
    """
    return "naive" if attention_path(impl) == "naive" or exporting() else "eager"


def default_impl() -> str:
    """The implementation layers use when they are given none (see the module docstring); a
    ValueError when ``$INLINE_ATTN_IMPL`` names no implementation."""
    impl = _state["default"]
    if impl is None:
        raise ValueError(f"INLINE_ATTN_IMPL={os.environ.get('INLINE_ATTN_IMPL')!r}: expected one of {IMPLS}")
    return impl


@contextlib.contextmanager
def use_impl(impl: str):
    """Context manager setting :func:`default_impl` (restored on exit), e.g. ``use_impl("eager")``
    to time a model without the fused kernels."""
    previous = _state["default"]
    _state["default"] = check_impl(impl)
    try:
        yield
    finally:
        _state["default"] = previous


@constant_when_compiled
def _triton_importable() -> bool:
    return triton_launchers.triton_installed()


@constant_when_compiled
def _triton_interpreting() -> bool:
    return triton_launchers.interpreting()


def _triton_mode_reason(device: torch.device) -> str | None:
    """Why this process's Triton mode (compiled, or the interpreter: fixed when triton is imported,
    by ``TRITON_INTERPRET``) cannot run tensors on ``device``, or None (the check the launch makes)."""
    interpreted = _triton_interpreting()
    if device.type == "cpu" and not interpreted:
        return (
            "impl='triton' on cpu tensors runs under Triton's interpreter, which must be chosen before triton is "
            "imported: set TRITON_INTERPRET=1 in the environment"
        )
    if device.type == "cuda" and interpreted:
        return "impl='triton' on CUDA tensors, but this process runs Triton's interpreter (TRITON_INTERPRET=1)"
    return None


def _warn_no_triton() -> None:
    if not _state["warned_triton"]:
        _state["warned_triton"] = True
        warnings.warn(
            "inline-attn: CUDA tensors but triton is not installed, so the InLine layers run the "
            "eager path (correct, slower); install the fused GPU kernels with: pip install 'inline-attn[gpu]'",
            RuntimeWarning,
            stacklevel=4,
        )


def _feature_map_name(feature_map) -> str | None:
    """None for the identity feature map (the only one the fused op computes), else its name."""
    if feature_map is None or feature_map == "identity":
        return None
    return feature_map if isinstance(feature_map, str) else type(feature_map).__name__


def in_onnx_export() -> bool:
    """True while ``torch.onnx.export`` traces a model (through ``torch.export``, or the legacy
    exporter's ``torch.jit`` trace; checked first: they cost ~0.1 us a call, the ONNX flag ~2 us)."""
    return (exporting() or torch.jit.is_tracing()) and torch.onnx.is_in_onnx_export()


def _in_functorch_transform() -> bool:
    # under torch.compile dynamo runs the transforms itself (and this query would break the graph)
    return not torch.compiler.is_compiling() and torch._C._are_functorch_transforms_active()


def tracing_reason() -> str | None:
    """Why no fused kernel may run in the trace or transform under way, or None.

    - ``torch.onnx.export(model, ...)``: ONNX has no fused InLine op, so the model is traced on the
      eager path, in standard operators (:func:`inline_attn.export.export_onnx` instead keeps the op
      in a ``torch.export`` program and translates it, :func:`inline_attn.export.inline_forward_onnx`);
    - a ``torch.func`` transform (``grad``, ``vmap``, ``jacrev``, ...): the fused op has no
      functorch rules, while the eager path is plain PyTorch ops that every transform supports.

    ``torch.export.export`` and ``torch.compile`` keep the fused op (it has a fake rule).
    """
    if in_onnx_export():
        return "torch.onnx.export is tracing the model and ONNX has no fused InLine op"
    if _in_functorch_transform():
        return "a torch.func transform (grad, vmap, ...) is active and the fused op has no functorch rule"
    return None


def unsupported(backend: str, q: torch.Tensor, feature_map=None, num_heads: int | None = None) -> str | None:
    """Why ``backend`` ("cpu" or "triton") cannot run these tensors, or None when it can (with
    ``num_heads``, on a GPU: also whether the Triton kernels fit its shared memory)."""
    traced = tracing_reason()
    if traced is not None:
        return traced
    name = _feature_map_name(feature_map)
    if name is not None:
        return f"the feature map {name!r} is not fused (only the identity feature map is)"
    if backend == "cpu":
        if q.device.type != "cpu":
            return f"impl='cpu' runs CPU tensors, got {q.device.type} tensors"
        if not cpu_kernel.cpu_kernel_available():
            return f"the C++ CPU kernel could not be built: {cpu_kernel.cpu_kernel_error()}"
        return None
    if q.device.type not in ("cuda", "cpu"):
        return f"impl='triton' runs CUDA tensors (or CPU tensors under Triton's interpreter), got {q.device.type}"
    if q.dtype not in _TRITON_DTYPES:
        return f"impl='triton' takes float32, bfloat16 or float16 tensors, got {q.dtype}"
    if not _triton_importable():
        return "triton is not installed: pip install 'inline-attn[gpu]'"
    mode = _triton_mode_reason(q.device)
    if mode is not None:
        return mode
    if num_heads is not None and q.device.type == "cuda":
        return triton_launchers.unfit_reason(q, num_heads)
    return None


def choose(
    q: torch.Tensor, feature_map=None, impl: str | None = None, num_heads: int | None = None
) -> tuple[str, str | None]:
    """(implementation, reason) for the layer core on tensors like ``q`` (``num_heads`` heads).

    ``impl=None`` means :func:`default_impl`. For ``"auto"`` the reason says why the fused op was
    not taken (None when it was); an explicit fused impl that cannot run raises ``ValueError``.
    """
    impl = check_impl(default_impl() if impl is None else impl)
    if impl in ("naive", "eager"):
        return impl, None
    if impl in FUSED_IMPLS:
        reason = unsupported(impl, q, feature_map, num_heads)
        if reason is not None:
            raise ValueError(reason)
        return impl, None
    if q.device.type == "cpu":
        reason = unsupported("cpu", q, feature_map)
        return ("eager", reason) if reason else ("cpu", None)
    if q.device.type == "cuda":
        reason = unsupported("triton", q, feature_map, num_heads)
        if reason is not None and reason.startswith("triton is not installed"):
            _warn_no_triton()
        return ("eager", reason) if reason else ("triton", None)
    return "eager", f"no fused kernel for {q.device.type} tensors"


def why_not_fused(
    q: torch.Tensor,
    feature_map=None,
    impl: str | None = None,
    num_heads: int | None = None,
    *,
    k: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    feat_size: tuple[int, int] | None = None,
    num_prefix_tokens: int = 0,
) -> str | None:
    """Why the InLine op on tensors like ``q`` does not run a fused kernel, or None when it does (in
    the spirit of ``nn.MultiheadAttention``'s ``why_not_fast_path``).

    ``q`` [B, N, C] (``num_heads`` heads, ``feat_size`` (H, W) with ``N = num_prefix_tokens + H*W``):
    the layer core :func:`inline_attn.ops.inline_tokens`. ``q`` [B, H, Nq, D]:
    :func:`inline_attn.ops.inline_attention` with ``k`` (default: self-attention),
    ``key_padding_mask`` and ``is_causal`` as it would be called.

    An explicit fused ``impl`` ("cpu" / "triton") that cannot run these tensors gets the reason
    its call would raise with. What the call itself refuses is a ValueError here too, with the same
    message: ``q`` that no path takes (not a tensor, not [B, N, C] or [B, H, N, D], not floating
    point, C = 0), heads that do not divide C, a token count that does not match ``feat_size`` (when
    given), an unknown feature map or ``impl``.
    """
    _check_like_q(q)
    if num_heads is not None and q.dim() == 3:
        num_heads = check_num_heads(num_heads, q.shape[-1])
    if feat_size is not None and q.dim() == 3:
        check_feat_size(feat_size, q.shape[1], num_prefix_tokens)
    get_feature_map(feature_map)
    impl = check_impl(default_impl() if impl is None else impl)
    if q.dim() == 4:
        mode = sdpa_mode_reason(q, q if k is None else k, key_padding_mask, is_causal)
        if mode is not None and impl != "naive":
            return mode
        q, num_heads = _heads_as_tokens(q), q.shape[1]
    if impl in FUSED_IMPLS:
        return unsupported(impl, q, feature_map, num_heads)
    chosen, reason = choose(q, feature_map, impl, num_heads)
    if chosen in FUSED_IMPLS:
        return None
    return reason or f"impl={chosen!r} was asked for"


def sdpa_mode_reason(q: torch.Tensor, k: torch.Tensor, key_padding_mask, is_causal: bool) -> str | None:
    """Why the fused layer core cannot compute this mode of the SDPA-shaped op (it is bidirectional,
    unmasked self-attention), or None."""
    if key_padding_mask is not None:
        return "a key_padding_mask is given and the fused op has no masks"
    if is_causal:
        return "is_causal=True and the fused op is bidirectional"
    if q.shape[2] != k.shape[2]:
        return f"cross-attention (Nq={q.shape[2]} queries, Nk={k.shape[2]} keys) and the fused op is self-attention"
    return None


def _heads_as_tokens(q: torch.Tensor) -> torch.Tensor:
    """A tensor like the layer core's [B, N, C] for [B, H, N, D] q (what the fused checks read:
    device, dtype, C); empty, so nothing is copied."""
    return q.new_empty((0, 0, q.shape[1] * q.shape[3]))


def choose_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask, is_causal: bool, feature_map, impl: str | None
) -> tuple[str, str | None]:
    """(implementation, reason) for :func:`inline_attn.ops.inline_attention` on [B, H, N, D] tensors:
    :func:`choose` on the heads as tokens, eager (with the reason) for the modes the fused op lacks;
    an explicit fused impl that cannot run them raises ``ValueError``."""
    impl = check_impl(default_impl() if impl is None else impl)
    if impl in ("naive", "eager"):
        return impl, None
    mode = sdpa_mode_reason(q, k, key_padding_mask, is_causal) or (
        "v's head_dim differs from q's and the fused op takes one head_dim" if v.shape[-1] != q.shape[-1] else None
    )
    if mode is not None:
        if impl in FUSED_IMPLS:
            raise ValueError(f"impl={impl!r}: {mode}")
        return "eager", mode
    return choose(_heads_as_tokens(q), feature_map, impl, q.shape[1])


def _check_like_q(q) -> None:
    if not isinstance(q, torch.Tensor):
        raise ValueError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if not q.dtype.is_floating_point:
        raise ValueError(f"q must have a floating-point dtype, got {q.dtype}")
    if q.dim() not in (3, 4):
        raise ValueError(
            f"q must be [B, N, C] (the layer core's tokens) or [B, H, N, D] (inline_attention's), got shape "
            f"{tuple(q.shape)}"
        )
    if q.shape[-1] == 0:
        raise ValueError(f"the channel count C must be positive, got C=0 (q of shape {tuple(q.shape)})")
