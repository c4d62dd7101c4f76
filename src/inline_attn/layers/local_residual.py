"""The predicted 3x3 local residual of InLine attention (paper Sec. 4.2)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from ..ops.predictor import predict_residual
from ..ops.tokens import apply_local_residual
from .common import check_flag, check_heads


def uses_local_residual(kind: str, local_residual: Optional[bool]) -> bool:
    """Whether a layer of attention ``kind`` has the local residual: ``local_residual`` when given,
    else the paper's models' choice, on for InLine only (Sec. 4.2; the baselines have none)."""
    local_residual = check_flag("local_residual", local_residual, optional=True)
    return kind == "inline" if local_residual is None else local_residual


class LocalResidual(nn.Sequential):
    """Predicts per-sample, per-channel 3x3 weights from a context vector and applies them to V.

    ``r = Conv1d(C, C, 1, groups=h) -> GELU -> Conv1d(C, 9C, 1, groups=h)`` on the context
    (the mean token of the attention input); channel c takes entries ``[9c, 9c + 9)`` as a
    row-major 3x3 kernel. State-dict names ``0.*`` and ``2.*`` as in the reference
    (``attn.residual.0.weight`` ...). ``dim`` must be a positive multiple of ``num_heads`` (ValueError).
    """

    def __init__(self, dim: int, num_heads: int):
        check_heads(dim, num_heads)  # the grouped convolutions need C a positive multiple of h
        super().__init__(
            nn.Conv1d(dim, dim, kernel_size=1, groups=num_heads),
            nn.GELU(),
            nn.Conv1d(dim, dim * 9, kernel_size=1, groups=num_heads),
        )
        self.dim = dim

    def predict(self, context: torch.Tensor) -> torch.Tensor:
        """context: [B, C] -> weights [B, C, 3, 3] (:func:`inline_attn.ops.predictor.predict_residual`:
        batched matmuls over the groups, in the parameters' dtype under autocast)."""
        if context.dim() != 2 or context.shape[1] != self.dim:
            raise ValueError(f"context must be [B, {self.dim}], got {tuple(context.shape)}")
        return predict_residual(context, *self.predictor_params(), groups=self[0].groups)

    def predictor_params(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(w1, b1, w2, b2): the two grouped 1x1 convolutions' weights and biases."""
        # on a layer step's host path: the modules' and parameters' dicts read directly (Sequential's
        # indexing and nn.Module.__getattr__ cost a Python call each)
        first, second = self._modules["0"]._parameters, self._modules["2"]._parameters
        return first["weight"], first["bias"], second["weight"], second["bias"]

    def forward(self, v: torch.Tensor, context: torch.Tensor, impl: str = "eager") -> torch.Tensor:
        """v: [B, C, H, W] values as an image; context: [B, C] -> [B, C, H, W]."""
        return apply_local_residual(v, self.predict(context), impl)
