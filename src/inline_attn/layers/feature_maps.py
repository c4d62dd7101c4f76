"""Learnable feature map for the paper's Table 1 ablation."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class AffineReLUFeatureMap(nn.Module):
    """phi(x) = relu(A x + b), one (A, b) shared by all heads; A starts at the identity."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.affine = nn.Linear(head_dim, head_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.eye_(self.affine.weight)
        nn.init.zeros_(self.affine.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.affine(x))
