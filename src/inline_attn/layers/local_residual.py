"""The predicted 3x3 local residual of InLine attention (paper Sec. 4.2)."""

from __future__ import annotations

import torch
import torch.nn as nn

from ..ops.tokens import apply_local_residual


class LocalResidual(nn.Sequential):
    """Predicts per-sample, per-channel 3x3 weights from a context vector and applies them to V.

    ``r = Conv1d(C, C, 1, groups=h) -> GELU -> Conv1d(C, 9C, 1, groups=h)`` on the context
    (the mean token of the attention input); channel c takes entries ``[9c, 9c + 9)`` as a
    row-major 3x3 kernel. State-dict names ``0.*`` and ``2.*`` as in the reference
    (``attn.residual.0.weight`` ...).
    """

    def __init__(self, dim: int, num_heads: int):
        super().__init__(
            nn.Conv1d(dim, dim, kernel_size=1, groups=num_heads),
            nn.GELU(),
            nn.Conv1d(dim, dim * 9, kernel_size=1, groups=num_heads),
        )
        self.dim = dim

    def predict(self, context: torch.Tensor) -> torch.Tensor:
        """context: [B, C] -> weights [B, C, 3, 3].

        The grouped 1x1 convolutions are evaluated as batched matmuls over the groups (same
        parameters, same result): oneDNN's convolution on length-1 signals costs several times
        its arithmetic when there are many samples (windows). Under autocast the prediction runs
        in the parameters' dtype (float32 in mixed precision): its arithmetic is negligible, and
        autocast's casts of inputs, weights and biases (and of their gradients) would be a dozen
        extra kernel launches per layer, which is what a small layer's step on a GPU waits on.
        """
        if context.dim() != 2 or context.shape[1] != self.dim:
            raise ValueError(f"context must be [B, {self.dim}], got {tuple(context.shape)}")
        device_type = context.device.type
        if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):
            with torch.autocast(device_type, enabled=False):
                return self._predict(context.to(self[0].weight.dtype))
        return self._predict(context)

    def _predict(self, context: torch.Tensor) -> torch.Tensor:
        conv1, act, conv2 = self[0], self[1], self[2]
        b, c = context.shape
        g = conv1.groups
        cg, og = c // g, conv2.out_channels // g
        # The first product in row layout [groups, B, C/g]: the context's gradient comes back
        # contiguous (a transposed one made the attention input's gradient, which adds it to every
        # token, an uncoalesced [B, N, C] sum: 0.2 ms per layer step on an H100 at 14 x 14, B 1024).
        y = torch.baddbmm(
            conv1.bias.view(g, 1, cg), context.view(b, g, cg).transpose(0, 1), conv1.weight.view(g, cg, cg).mT
        )
        # The second in column layout [groups, 9C/g, B]: W @ y takes the largest weight in its own
        # [out, in] layout, so neither the product nor its gradient needs a transposed copy.
        y = torch.baddbmm(conv2.bias.view(g, og, 1), conv2.weight.view(g, og, cg), act(y).mT)
        # channel c takes outputs [9c, 9c + 9): a strided view, copied once by whoever needs a layout
        return y.view(g * og, b).t().view(b, c, 3, 3)

    def forward(self, v: torch.Tensor, context: torch.Tensor, impl: str = "eager") -> torch.Tensor:
        """v: [B, C, H, W] values as an image; context: [B, C] -> [B, C, H, W]."""
        return apply_local_residual(v, self.predict(context), impl)
