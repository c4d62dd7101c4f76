"""InLine and linear attention shaped like ``F.scaled_dot_product_attention``.

``inline_attention(q, k, v, key_padding_mask=..., is_causal=..., scale=...)`` on
``q: [B, H, Nq, D]``, ``k: [B, H, Nk, D]``, ``v: [B, H, Nk, Dv]``, for self- and cross-attention
(``Nq != Nk``), variable-length batches (``key_padding_mask``: [B, Nk] bool, True = a padded key,
as ``nn.MultiheadAttention``'s) and causal order. The weights of every mode are written out in
:mod:`.causal` and computed explicitly by :func:`inline_attn.ops.attention_weights` (the float64
reference). ``scale`` plays SDPA's role: InLine's weights are the first-order expansion of
``softmax(scale * q.k)`` around the mean logit.

Paths: the fused layer core (C++ on the CPU, Triton on a GPU) for bidirectional, unmasked
self-attention with the identity feature map; the linear-time eager path (:mod:`.eager`,
:mod:`.causal`) otherwise, and :func:`inline_attn.ops.why_not_fused` (given ``k``,
``key_padding_mask``, ``is_causal``) names the reason; ``impl="naive"``: the explicit weights.
"""

from __future__ import annotations

import torch

from . import dispatch
from ._checks import check_attention_modes, check_qkv, check_scale, mapped
from .causal import InLineState, causal_inline, causal_linear, keep_weights, masked_inline
from .eager import (
    as_compute,
    autocast_dtype,
    float32_region,
    eager_inline_attention,
    eager_linear_attention,
    linear_of_features,
)
from .feature_maps import FeatureMap, get_feature_map
from .fused.op import inline_core
from .naive import naive_attention


def inline_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    feature_map: FeatureMap = "identity",
    impl: str | None = None,
) -> torch.Tensor:
    """InLine attention (paper Eq. 5) in linear time, shaped like SDPA.

    Args:
        q: [B, H, Nq, D]; k: [B, H, Nk, D]; v: [B, H, Nk, Dv] (any strides, one float dtype).
        key_padding_mask: [B, Nk] bool, True where a key is padding: padded keys leave the sums and
            means, N is each sample's count of valid keys; a sample with no valid key gives zeros.
        is_causal: query i sees keys ``j <= i`` (needs ``Nq == Nk``); weights
            ``(1 + s phi(q_i).(phi(k_j) - mean_{m<=i} phi(k_m))) / i`` (the first-order expansion of
            causal softmax, as in ZeroS, Lu et al., NeurIPS 2025, arXiv 2602.05230).
        scale: s, default ``D**-0.5``.
        feature_map: phi (identity, relu, leakyrelu, exp or a callable).
        impl: None (the process default), "auto", "naive", "eager", "cpu" or "triton"
            (:data:`inline_attn.ops.IMPLS`); an explicit fused impl that cannot run raises.

    Returns:
        [B, H, Nq, Dv] in q's dtype (the autocast dtype under autocast).
    """
    check_qkv(q, k, v)
    check_attention_modes(q, k, key_padding_mask, is_causal)
    s = check_scale(scale)
    s = q.shape[-1] ** -0.5 if s is None else s
    chosen, _ = dispatch.choose_attention(q, k, v, key_padding_mask, is_causal, feature_map, impl)
    if chosen == "naive":
        mode = dict(key_padding_mask=key_padding_mask, is_causal=is_causal)
        return naive_attention(q, k, v, kind="inline", feature_map=feature_map, scale=s, **mode)
    if chosen in dispatch.FUSED_IMPLS:
        return _fused_inline(q, k, v, s, chosen)
    if key_padding_mask is None and not is_causal:
        return eager_inline_attention(q, k, v, feature_map=feature_map, scale=s)
    phi = get_feature_map(feature_map)
    with float32_region(q) as out_dtype:
        qf, kf, vf = mapped(phi, as_compute(q), "q"), mapped(phi, as_compute(k), "k"), as_compute(v)
        keep = keep_weights(key_padding_mask, qf.dtype)
        out = causal_inline(qf, kf, vf, keep, s) if is_causal else masked_inline(qf, kf, vf, keep, s)
    return out.to(out_dtype)


def _fused_inline(q, k, v, scale: float, backend: str) -> torch.Tensor:
    """The fused layer core without a residual on [B, H, N, D] heads: token-major views in, a
    [B, H, N, D] view of its output out (a one-row grid: the grid only places the residual)."""
    low = autocast_dtype(q)
    if low is not None:  # the eager path's contract: the autocast dtype out
        q, k, v = (t.to(low) for t in (q, k, v))
    b, h, n, d = q.shape
    tokens = [t.transpose(1, 2).reshape(b, n, h * t.shape[-1]) for t in (q, k, v)]
    out = inline_core(*tokens, None, h, scale, n, 1, 0, backend)
    return out.view(b, n, h, v.shape[-1]).transpose(1, 2)  # Dv named: B or H may be 0


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    feature_map: FeatureMap = "relu",
    eps: float = 1e-6,
    impl: str | None = None,
) -> torch.Tensor:
    """Vanilla linear attention (paper Eq. 3) shaped like SDPA: ``phi(q_i) S / (phi(q_i).z + eps)``
    over the keys each query sees (masks and causal order as :func:`inline_attention`).

    Args:
        q: [B, H, Nq, D]; k: [B, H, Nk, D]; v: [B, H, Nk, Dv].
        impl: "naive" for the explicit weights; any other value of :data:`inline_attn.ops.IMPLS`
            runs the eager path (there is no fused linear attention).
    Returns:
        [B, H, Nq, Dv].
    """
    check_qkv(q, k, v)
    check_attention_modes(q, k, key_padding_mask, is_causal)
    if dispatch.attention_path(impl, "linear") == "naive":
        mode = dict(key_padding_mask=key_padding_mask, is_causal=is_causal)
        return naive_attention(q, k, v, kind="linear", feature_map=feature_map, eps=eps, **mode)
    if key_padding_mask is None and not is_causal:
        return eager_linear_attention(q, k, v, feature_map=feature_map, eps=eps)
    phi = get_feature_map(feature_map)
    with float32_region(q) as out_dtype:
        qf, kf, vf = mapped(phi, as_compute(q), "q"), mapped(phi, as_compute(k), "k"), as_compute(v)
        keep = keep_weights(key_padding_mask, qf.dtype)
        if is_causal:
            out = causal_linear(qf, kf, vf, keep, eps)
        else:
            out = linear_of_features(qf, kf * keep, vf, eps)
    return out.to(out_dtype)


def inline_attention_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: InLineState | None = None,
    *,
    key_padding_mask: torch.Tensor | None = None,
    scale: float | None = None,
    feature_map: FeatureMap = "identity",
) -> tuple[torch.Tensor, InLineState]:
    """Causal InLine one token at a time (generation): equals ``inline_attention(..., is_causal=True)``
    row by row.

    Args:
        q, k: [B, H, 1, D]; v: [B, H, 1, Dv]: the new token.
        state: from the previous step or :func:`inline_state` (a prefill); None = no keys yet. A
            state of another batch, head count, head dims, compute dtype or device than the token's
            (its tensors would broadcast) and anything but an :class:`InLineState` are refused
            (ValueError).
        key_padding_mask: [B, 1] bool, True where the new token is padding (it leaves the state).
        scale, feature_map: as :func:`inline_attention`.
    Returns:
        (output [B, H, 1, Dv] in q's dtype, the new state (float32 for low-precision inputs)).
    """
    check_qkv(q, k, v)
    if q.shape[2] != 1 or k.shape[2] != 1:
        raise ValueError(f"a step takes one token: q {tuple(q.shape)} and k {tuple(k.shape)} must have Nq = Nk = 1")
    check_attention_modes(q, k, key_padding_mask, False)
    if state is not None:
        _check_state(state, q, v)
    phi = get_feature_map(feature_map)
    s = check_scale(scale)
    s = q.shape[-1] ** -0.5 if s is None else s
    with float32_region(q) as out_dtype:
        qf, kf, vf = mapped(phi, as_compute(q), "q"), mapped(phi, as_compute(k), "k"), as_compute(v)
        if state is None:
            b, h, _, d = kf.shape
            state = InLineState.empty(b, h, d, vf.shape[-1], dtype=kf.dtype, device=kf.device)
        keep = keep_weights(key_padding_mask, kf.dtype)
        keep = torch.ones_like(state.count) if keep is None else keep
        out, state = state.step(qf, kf, vf, keep, s)
    return out.to(out_dtype), state


def _check_state(state, q: torch.Tensor, v: torch.Tensor) -> None:
    """``state`` an :class:`InLineState` for the step's token (q [B, H, 1, D], v [B, H, 1, Dv]): its
    tensors shaped for the same B, H, D, Dv, in the dtype the step computes in, on q's device."""
    if not isinstance(state, InLineState):
        raise ValueError(
            f"state must be an InLineState (from inline_state or a previous step), got {type(state).__name__}"
        )
    b, h, _, d = q.shape
    dv, dtype = v.shape[-1], as_compute(q).dtype
    expected = ((b, h, d, dv), (b, h, 1, d), (b, h, 1, dv), (b, 1, 1, 1))
    fields = (state.comoment, state.key_mean, state.value_mean, state.count)
    if all(tuple(t.shape) == e and t.dtype == dtype and t.device == q.device for t, e in zip(fields, expected)):
        return
    c = state.comoment
    sizes = "B={}, H={}, D={}, Dv={}".format(*c.shape) if c.dim() == 4 else f"a comoment of shape {tuple(c.shape)}"
    raise ValueError(
        f"state is for {sizes}, {c.dtype} on {c.device}; got "
        f"q/k/v for B={b}, H={h}, D={d}, Dv={dv}, {dtype} on {q.device} (q of shape {tuple(q.shape)}, {q.dtype})"
    )


def inline_state(
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    key_padding_mask: torch.Tensor | None = None,
    feature_map: FeatureMap = "identity",
) -> InLineState:
    """The causal state after the keys k [B, H, N, D] and values v [B, H, N, Dv] (a prompt), to go
    on with :func:`inline_attention_step`."""
    check_qkv(k, k, v)
    check_attention_modes(k, k, key_padding_mask, False)
    phi = get_feature_map(feature_map)
    with float32_region(k):
        kf, vf = mapped(phi, as_compute(k), "k"), as_compute(v)
        return InLineState.of_keys(kf, vf, keep_weights(key_padding_mask, kf.dtype))
