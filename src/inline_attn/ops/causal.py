"""Key-padding masks and causal order for the linear-time attentions, and InLine's recurrent step.

Per head, with ``m_j`` = 1 for a valid key and 0 for a padded one, and the keys a query sees
``J_i = {j : m_j = 1}`` (bidirectional) or ``{j <= i : m_j = 1}`` (causal), ``c_i = |J_i|``:

- InLine: ``w_ij = (1 + s phi(q_i).(phi(k_j) - k_bar_i)) / c_i`` for ``j in J_i``, with
  ``k_bar_i = mean_{J_i} phi(k_j)``; rows sum to 1. Causal, it is the first-order expansion of
  causal softmax, the starting point of ZeroS (Lu et al., NeurIPS 2025, arXiv 2602.05230); at the
  last row it is the bidirectional op (paper Eq. 5, the reference's scale convention).
- linear: ``w_ij = phi(q_i).phi(k_j) / (sum_{J_i} phi(q_i).phi(k_s) + eps)``.

A query with no key (``c_i = 0``: a fully padded sample) gets a zero output and zero gradients.

The causal forms run in O(N d^2): ``O_i = v_bar_i + s/c_i (phi(q_i)^T P_i - (phi(q_i).K_i) v_bar_i)``
with the prefix sums ``P_i = sum_{J_i} k_j v_j^T``, ``K_i = sum_{J_i} k_j``; ``q_i^T P_i`` is
taken chunk by chunk (explicit weights inside a chunk, the exclusive prefix of the chunks' D x Dv
products between chunks). Keys and values are shifted by the first token first: the output does
not depend on the shift, and it keeps the uncentred sums from cancelling.

:class:`InLineState` carries causal InLine one token at a time (for generation): the centred
D x Dv sum ``sum_{J} (k_j - k_bar)(v_j - v_bar)^T``, the key mean, the value mean and the count,
updated as Welford's co-moment; each step's output equals the full causal pass's row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

#: tokens per chunk of the causal prefix sums (the explicit in-chunk weights are CHUNK x CHUNK)
CHUNK = 64


def keep_weights(key_padding_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """[B, Nk] bool (True = padding, as ``nn.MultiheadAttention``) -> [B, 1, Nk, 1] 1 / 0 in ``dtype``."""
    if key_padding_mask is None:
        return None
    return (~key_padding_mask).to(dtype)[:, None, :, None]


def masked_inline(q, k, v, keep, scale):
    """Bidirectional InLine over the valid keys: phi-mapped q [B, H, Nq, D], k [B, H, N, D],
    v [B, H, N, Dv], keep [B, 1, N, 1] -> [B, H, Nq, Dv]."""
    count = keep.sum(dim=2, keepdim=True)  # [B, 1, 1, 1]
    per = count.clamp_min(1).reciprocal()
    k_bar = (k * keep).sum(dim=2, keepdim=True) * per
    v_bar = (v * keep).sum(dim=2, keepdim=True) * per
    kv = ((k - k_bar) * keep).transpose(-2, -1) @ (v - v_bar)  # [B, H, D, Dv]
    return torch.matmul(q, kv * (scale * per)) + v_bar


def prefix_products(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """``q_i^T sum_{j <= i} k_j v_j^T`` for every i: q, k [B, H, N, D], v [B, H, N, Dv] -> [B, H, N, Dv].

    Chunks of ``chunk`` tokens: inside a chunk the causal weights ``tril(q k^T)`` explicitly, across
    chunks the exclusive prefix sum of the chunks' ``k^T v`` (O(N chunk d + N d^2))."""
    b, h, n, d = q.shape
    pad = -n % chunk
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    nc = (n + pad) // chunk
    qc, kc, vc = (t.reshape(b, h, nc, chunk, t.shape[-1]) for t in (q, k, v))
    intra = torch.tril(qc @ kc.transpose(-2, -1)) @ vc  # [B, H, nc, chunk, Dv]
    per_chunk = kc.transpose(-2, -1) @ vc  # [B, H, nc, D, Dv]
    before = per_chunk.cumsum(dim=2) - per_chunk  # the chunks before each one
    out = intra + qc @ before
    return out.reshape(b, h, nc * chunk, v.shape[-1])[:, :, :n]  # Dv named: B or H may be 0


def causal_inline(q, k, v, keep, scale, chunk: int = CHUNK):
    """Causal InLine (module docstring): phi-mapped q, k [B, H, N, D], v [B, H, N, Dv], keep
    [B, 1, N, 1] or None -> [B, H, N, Dv]."""
    # the shift: any constant leaves the output unchanged, so its gradient is zero (detached)
    k_ref, v_ref = k[:, :, :1].detach(), v[:, :, :1].detach()
    ks, vs = k - k_ref, v - v_ref
    if keep is None:
        count = torch.arange(1, k.shape[2] + 1, dtype=k.dtype, device=k.device)[:, None]  # [N, 1]
    else:
        ks, vs = ks * keep, vs * keep  # padded keys leave every sum
        count = keep.cumsum(dim=2)  # [B, 1, N, 1]
    per = count.clamp_min(1).reciprocal()
    v_mean = vs.cumsum(dim=2) * per  # v_bar_i - v_ref
    q_dot_k = (q * ks.cumsum(dim=2)).sum(dim=-1, keepdim=True)  # q_i . K_i
    attended = (prefix_products(q, ks, vs, chunk) - q_dot_k * v_mean) * (scale * per)
    seen = count > 0  # a query with no key yet gets zero
    return torch.where(seen, v_ref + v_mean + attended, torch.zeros_like(attended))


def causal_linear(q, k, v, keep, eps: float, chunk: int = CHUNK):
    """Causal linear attention: phi-mapped q, k [B, H, N, D], v [B, H, N, Dv], keep or None -> [B, H, N, Dv]."""
    if keep is not None:
        k = k * keep
    normaliser = (q * k.cumsum(dim=2)).sum(dim=-1, keepdim=True)
    return prefix_products(q, k, v, chunk) / (normaliser + eps)


@dataclass(frozen=True)
class InLineState:
    """Causal InLine's state after the keys so far, per sample and head (module docstring).

    comoment: [B, H, D, Dv] ``sum_J (phi(k_j) - k_bar)(v_j - v_bar)^T``; key_mean: [B, H, 1, D];
    value_mean: [B, H, 1, Dv]; count: [B, 1, 1, 1] valid keys so far (float).
    """

    comoment: torch.Tensor
    key_mean: torch.Tensor
    value_mean: torch.Tensor
    count: torch.Tensor

    @classmethod
    def empty(cls, b: int, h: int, d: int, dv: int, *, dtype=torch.float32, device=None) -> "InLineState":
        """The state before any key."""
        z = dict(dtype=dtype, device=device)
        return cls(
            torch.zeros(b, h, d, dv, **z),
            torch.zeros(b, h, 1, d, **z),
            torch.zeros(b, h, 1, dv, **z),
            torch.zeros(b, 1, 1, 1, **z),
        )

    @classmethod
    def of_keys(cls, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None = None) -> "InLineState":
        """The state after the phi-mapped keys k [B, H, N, D] and values v [B, H, N, Dv] (prefill)."""
        if keep is None:
            keep = torch.ones(k.shape[0], 1, k.shape[2], 1, dtype=k.dtype, device=k.device)
        count = keep.sum(dim=2, keepdim=True)
        per = count.clamp_min(1).reciprocal()
        k_mean = (k * keep).sum(dim=2, keepdim=True) * per
        v_mean = (v * keep).sum(dim=2, keepdim=True) * per
        comoment = ((k - k_mean) * keep).transpose(-2, -1) @ (v - v_mean)
        return cls(comoment, k_mean, v_mean, count)

    def step(self, q, k, v, keep: torch.Tensor, scale: float) -> tuple[torch.Tensor, "InLineState"]:
        """One token: phi-mapped q, k [B, H, 1, D], v [B, H, 1, Dv], keep [B, 1, 1, 1] (0 = a padded
        token) -> (output [B, H, 1, Dv], the state after it). Functional: autograd flows through."""
        count = self.count + keep
        per = count.clamp_min(1).reciprocal()
        dk = (k - self.key_mean) * keep
        key_mean = self.key_mean + dk * per
        value_mean = self.value_mean + (v - self.value_mean) * keep * per
        comoment = self.comoment + dk.transpose(-2, -1) @ (v - value_mean)  # Welford's co-moment
        out = value_mean + torch.matmul(q, comoment) * (scale * per)
        return out, InLineState(comoment, key_mean, value_mean, count)
