"""Exponential moving average of the weights (CSwin's recipe), kept on the training device."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn


class ModelEma(nn.Module):
    """``ema = decay * ema + (1 - decay) * weights`` after every optimizer step; buffers are copied."""

    def __init__(self, model: nn.Module, decay: float = 0.9998):
        super().__init__()
        if not 0 <= decay < 1:
            raise ValueError(f"ema_decay={decay} must be in [0, 1)")
        self.module = copy.deepcopy(model).eval()
        self.decay = decay
        for p in self.module.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        ema_sd = self.module.state_dict()
        for k, v in model.state_dict().items():
            e = ema_sd[k]
            if e.dtype.is_floating_point:
                e.mul_(self.decay).add_(v.detach(), alpha=1 - self.decay)
            else:
                e.copy_(v)

    def forward(self, x):
        return self.module(x)
