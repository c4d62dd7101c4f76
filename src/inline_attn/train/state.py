"""What a training run carries from step to step, and what its checkpoints save."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn

from ..runtime.ema import ModelEma
from ..runtime.optim import CosineSchedule


@dataclass
class TrainState:
    """The model and its optimisation state, and where the run stands.

    ``epoch`` counts finished epochs, ``step_in_epoch`` the optimizer steps done in the current
    one, ``step`` all optimizer steps; ``partial`` sums this rank's loss and samples over the
    current epoch so far; ``elapsed_s`` is the training time of earlier processes (resumes).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    sched: CosineSchedule
    scaler: Optional[torch.amp.GradScaler] = None
    ema: Optional[ModelEma] = None
    epoch: int = 0
    step_in_epoch: int = 0
    step: int = 0
    history: list[dict] = field(default_factory=list)
    partial: torch.Tensor = field(default_factory=lambda: torch.zeros(2, dtype=torch.float64))
    elapsed_s: float = 0.0

    @property
    def lr(self) -> float:
        """The learning rate of the next step (the schedule is its one source)."""
        return self.sched.get_last_lr()
