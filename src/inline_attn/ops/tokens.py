"""The InLine layer core on token-major tensors: attention over all heads plus the local residual.

``O = concat_heads(InLine(Q_h, K_h, V_h)) + residual(V)`` with Q, K, V: [B, N, C] (views into the
qkv projection, heads as contiguous channel blocks) and the predicted 3x3 residual (paper
Sec. 4.2) added on the H x W grid tokens (not on the prefix tokens). :func:`inline_tokens` is the
one entry point; :mod:`.dispatch` chooses its implementation (``impl``: auto, naive, eager, cpu,
triton).
"""

from __future__ import annotations

import torch

from . import dispatch
from ._checks import check_feat_size, check_num_heads, check_scale, check_tensor, check_tokens
from .eager import autocast_dtype, eager_inline_attention, local_residual
from .fused.op import inline_core, inline_layer_core, runs_as_custom_op
from .feature_maps import FeatureMap
from .naive import naive_attention, naive_local_residual
from .predictor import predict_residual


def add_to_grid_tokens(out: torch.Tensor, res: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """out: [B, P + HW, C] plus res: [B, HW, C] on the grid tokens; prefix tokens untouched."""
    if num_prefix_tokens == 0:
        return out + res
    return torch.cat([out[:, :num_prefix_tokens], out[:, num_prefix_tokens:] + res], dim=1)


def apply_local_residual(v_img: torch.Tensor, weights: torch.Tensor, impl: str = "eager") -> torch.Tensor:
    """v_img [B, C, H, W], weights [B, C, 3, 3] -> [B, C, H, W]: the nine shifted multiply-adds for
    ``impl="naive"`` and while exporting, the grouped convolution otherwise
    (:func:`.dispatch.residual_path`); weights are cast to V's dtype."""
    fn = naive_local_residual if dispatch.residual_path(impl) == "naive" else local_residual
    return fn(v_img, weights.to(v_img.dtype))


def grid_residual(
    v: torch.Tensor,
    weights: torch.Tensor,
    feat_size: tuple[int, int],
    num_prefix_tokens: int = 0,
    impl: str = "eager",
) -> torch.Tensor:
    """The 3x3 local residual of token-major values: v [B, P + H*W, C] -> [B, H*W, C] (a view).

    weights: [B, C, 3, 3]. ``impl="naive"`` (and any impl while exporting) uses the nine shifted
    multiply-adds, any other value the grouped convolution.
    """
    check_tensor("v", v)
    check_tensor("weights", weights)
    if v.dim() != 3:
        raise ValueError(f"v must be [B, N, C], got shape {tuple(v.shape)}")
    b, n, c = v.shape
    h, w = check_feat_size(feat_size, n, num_prefix_tokens)
    v_img = v[:, num_prefix_tokens:].reshape(b, h, w, c).permute(0, 3, 1, 2)  # [B, C, H, W] view
    return apply_local_residual(v_img, weights, impl).flatten(2).transpose(1, 2)


def residual_taps(weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, C, 3, 3] residual weights -> [B, 9, C] taps over channels (the fused op's layout), in
    ``dtype`` (q's), except that float32 weights stay float32.

    Under autocast the predictor runs in float32 (:meth:`LocalResidual.predict`) while q, k, v are
    bf16 / fp16. The fused kernels compute in float32 whatever their inputs, so float32 taps cost
    nothing there, keep the predicted weights unrounded, and give back a float32 gradient that
    needs no cast in the backward (one launch fewer on a GPU).
    """
    b, c = weights.shape[:2]
    if weights.dtype == torch.float32:
        dtype = torch.float32
    # A cast copies into the contiguous layout the kernels read (one copy for both); without a cast
    # ``to`` returns the strided view, and the kernels' launchers make it contiguous.
    return weights.reshape(b, c, 9).transpose(1, 2).to(dtype=dtype, memory_format=torch.contiguous_format)


def inline_tokens(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_heads: int,
    feat_size: tuple[int, int],
    residual_weights: torch.Tensor | None = None,
    num_prefix_tokens: int = 0,
    feature_map: FeatureMap = None,
    scale: float | None = None,
    impl: str | None = None,
) -> torch.Tensor:
    """InLine attention over ``num_heads`` heads plus the local residual, token-major.

    Args:
        q, k, v: [B, N, C] with ``N = num_prefix_tokens + H*W``, one float dtype, one device (any
            strides; views into a fused qkv projection are read in place by the fused kernels).
        num_heads: h; head i owns channels ``[i*C/h, (i+1)*C/h)``.
        feat_size: (H, W) of the grid tokens.
        residual_weights: [B, C, 3, 3] predicted residual kernels, or None for no residual.
        num_prefix_tokens: tokens before the grid (a cls token): attended to, no residual.
        feature_map: phi (default identity; the fused kernels compute identity only).
        scale: default ``(C/h)**-0.5``.
        impl: one of :data:`inline_attn.ops.dispatch.IMPLS`; None = the process default
            (:func:`inline_attn.ops.use_impl`).

    Returns:
        [B, N, C]: ``O_i = phi(q_i) M + v_bar`` per head (paper Eq. 5) plus the residual, in q's
        dtype (the autocast dtype under autocast).
    """
    check_tokens(q, k, v, residual_weights)
    b, n, c = q.shape
    num_heads = check_num_heads(num_heads, c)
    h, w = check_feat_size(feat_size, n, num_prefix_tokens)
    d = c // num_heads
    scale = check_scale(scale)
    s = d**-0.5 if scale is None else scale
    chosen, _ = dispatch.choose(q, feature_map, impl, num_heads)
    return _run_chosen(q, k, v, residual_weights, num_heads, (h, w), num_prefix_tokens, feature_map, s, chosen)


def _run_chosen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    residual_weights: torch.Tensor | None,
    num_heads: int,
    grid: tuple[int, int],
    num_prefix_tokens: int,
    feature_map: FeatureMap,
    scale: float,
    chosen: str,
) -> torch.Tensor:
    """:func:`inline_tokens` on checked arguments, run by the implementation ``chosen`` -> [B, N, C].

    ``grid``: (H, W) ints with ``N = num_prefix_tokens + H*W``; ``scale``: a float; ``chosen``: the
    answer of :func:`.dispatch.choose`. Its two callers check and choose once each.
    """
    h, w = grid
    if chosen in dispatch.FUSED_IMPLS:
        w9 = residual_taps(residual_weights, q.dtype) if residual_weights is not None else None
        return inline_core(q, k, v, w9, num_heads, scale, h, w, num_prefix_tokens, chosen)
    b, n, c = q.shape
    d = c // num_heads
    qh, kh, vh = (t.reshape(b, n, num_heads, d).transpose(1, 2) for t in (q, k, v))  # [B, h, N, d]
    if chosen == "naive":
        out = naive_attention(qh, kh, vh, kind="inline", feature_map=feature_map, scale=scale)
    else:
        out = eager_inline_attention(
            qh, kh, vh, feature_map="identity" if feature_map is None else feature_map, scale=scale
        )
    out = out.transpose(1, 2).reshape(b, n, c)
    if residual_weights is None:
        return out
    res = grid_residual(v, residual_weights, grid, num_prefix_tokens, impl=chosen)
    return add_to_grid_tokens(out, res.to(out.dtype), num_prefix_tokens)


def inline_layer_tokens(
    x: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    predictor: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    num_heads: int,
    feat_size: tuple[int, int],
    num_prefix_tokens: int = 0,
    feature_map: FeatureMap = None,
    scale: float | None = None,
    impl: str | None = None,
) -> torch.Tensor:
    """The InLine layer core with the residual predicted from the layer input (paper Sec. 4.2):
    :func:`inline_tokens` with ``residual_weights = P(mean_n x)``.

    Args:
        x: [B, N, C] the layer input; its token mean (prefix tokens included, as the reference)
            is the predictor's context.
        predictor: (w1, b1, w2, b2) of the predictor's grouped products, one group per head
            (:meth:`inline_attn.layers.LocalResidual.predictor_params`): tensors of one float dtype on
            x's device. Outside autocast it must be x's dtype, as ``nn.Linear`` requires of its
            input (ValueError otherwise, for every ``impl``); under autocast x's token mean is cast
            to it.
        the rest: as :func:`inline_tokens`.

    On the fused implementations in eager mode the prediction runs inside the layer core's one
    autograd node (:func:`~inline_attn.ops.fused.op.inline_layer_core`: in C++ on the CPU, one
    kernel each way on Triton); otherwise (and while compiling, exporting or under a dispatch mode) it is
    :func:`predict_residual` under autograd beside the core.
    """
    check_tokens(q, k, v)
    check_tensor("x", x)
    if x.shape != q.shape or x.device != q.device:
        raise ValueError(
            f"x must have q's shape {tuple(q.shape)} and device {q.device}, got {tuple(x.shape)} on {x.device}"
        )
    w1, b1, w2, b2 = predictor
    _check_predictor_dtypes(x, predictor)
    c = q.shape[-1]
    num_heads = check_num_heads(num_heads, c)
    if w1.shape[0] != c or w1.shape[1:].numel() != c // num_heads or w2.shape[0] != 9 * c:
        raise ValueError(
            f"predictor weights {tuple(w1.shape)} and {tuple(w2.shape)} do not match {num_heads} groups of "
            f"C={c}: expected [{c}, {c // num_heads}(, 1)] and [{9 * c}, {c // num_heads}(, 1)]"
        )
    h, w = check_feat_size(feat_size, q.shape[1], num_prefix_tokens)
    scale = check_scale(scale)
    s = (c // num_heads) ** -0.5 if scale is None else scale
    return layer_core_tokens(x, q, k, v, predictor, num_heads, (h, w), num_prefix_tokens, feature_map, s, impl)


def _check_predictor_dtypes(x: torch.Tensor, predictor) -> None:
    """The predictor's four tensors: one float dtype on x's device, and x's dtype outside autocast
    (:func:`inline_layer_tokens`)."""
    for name, t in zip(("w1", "b1", "w2", "b2"), predictor):
        check_tensor(f"predictor {name}", t)
        if t.dtype != predictor[0].dtype or t.device != x.device:
            raise ValueError(
                f"the predictor's tensors must share one dtype on x's device {x.device}, got w1 {predictor[0].dtype} "
                f"and {name} {t.dtype} on {t.device}"
            )
    if x.dtype != predictor[0].dtype and autocast_dtype(x) is None:
        raise ValueError(
            f"x is {x.dtype} and the predictor's parameters are {predictor[0].dtype}: outside autocast they must "
            f"share one dtype (cast the model or the input, or run under torch.autocast)"
        )


def layer_core_tokens(
    x: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    predictor: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    num_heads: int,
    grid: tuple[int, int],
    num_prefix_tokens: int,
    feature_map: FeatureMap,
    scale: float,
    impl: str | None,
) -> torch.Tensor:
    """:func:`inline_layer_tokens` on arguments its caller has validated -> [B, N, C].

    For layers: their construction fixes the predictor's shapes, the heads and the scale, and
    their forward checks x and the grid once, so the layer step's host path repeats no check
    (a small layer's eager GPU step waits on its host time). ``grid``: (H, W) ints with
    ``N = num_prefix_tokens + H*W``; ``scale``: a float; the rest as :func:`inline_layer_tokens`.
    """
    chosen, _ = dispatch.choose(q, feature_map, impl, num_heads)
    if chosen not in dispatch.FUSED_IMPLS or runs_as_custom_op():
        w1, b1, w2, b2 = predictor
        weights = predict_residual(x.mean(dim=1), w1, b1, w2, b2, groups=num_heads)
        return _run_chosen(q, k, v, weights, num_heads, grid, num_prefix_tokens, feature_map, scale, chosen)
    h, w = grid
    return inline_layer_core(x, q, k, v, *predictor, num_heads, scale, h, w, num_prefix_tokens, chosen)
