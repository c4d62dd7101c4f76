"""The step schedules: one base class, the state a checkpoint holds is the step count only."""

from __future__ import annotations

import pytest
import torch

from inline_attn.runtime.optim import CosineSchedule, PolySchedule, StepSchedule


def _schedule(which: str, opt) -> StepSchedule:
    if which == "cosine":
        return CosineSchedule(opt, lr=1.0, steps_per_epoch=10, epochs=5, warmup_epochs=1, warmup_lr=0.0)
    return PolySchedule(opt, lr=6e-5, iters=100, power=1.0, warmup_iters=10)


@pytest.mark.parametrize("which", ["cosine", "poly"])
def test_schedules_share_step_state_and_last_lr(which):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    s = _schedule(which, opt)
    assert isinstance(s, StepSchedule)
    for _ in range(7):
        s.step()
    assert s.state_dict() == {"step_count": 7}
    assert s.get_last_lr() == s.lr_at(7) == opt.param_groups[0]["lr"]
    again = _schedule(which, opt)
    assert opt.param_groups[0]["lr"] == again.lr_at(0)
    again.load_state_dict({"step_count": 7})
    assert again.step_count == 7 and opt.param_groups[0]["lr"] == s.lr_at(7)
