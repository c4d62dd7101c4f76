"""A captured step refuses what its static buffers would convert silently (a batch of another dtype
or device than the example's) and a negative warm-up count; the capture is the eager stand-in."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from inline_attn.runtime.graphs import GraphedEvalStep, GraphedTrainStep, eager_capture


def _step(**kwargs) -> GraphedTrainStep:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(2, 4), torch.tensor([0, 2])
    return GraphedTrainStep(model, opt, F.cross_entropy, x, y, why_not=None, capture_fn=eager_capture, **kwargs)


@pytest.mark.parametrize(
    "inputs, targets, name",
    [
        (torch.randn(2, 4, dtype=torch.float64), torch.tensor([0, 1]), "inputs of dtype torch.float64"),
        (torch.randn(2, 4, dtype=torch.float16), torch.tensor([0, 1]), "inputs of dtype torch.float16"),
        (torch.randn(2, 4), torch.tensor([0.0, 1.0]), "targets of dtype torch.float32"),
        (torch.randn(2, 4), torch.tensor([0, 1], dtype=torch.int32), "targets of dtype torch.int32"),
        (torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 1, 0, 1, 0]), "inputs of dtype torch.float64"),
    ],
)
def test_a_batch_the_buffers_would_convert_is_refused(inputs, targets, name):
    step = _step()
    with pytest.raises(ValueError, match=rf"{name} on cpu, but the step was captured for"):
        step(inputs, targets)
    assert step.replays == 0


def test_a_batch_like_the_example_replays():
    step = _step()
    loss = step(torch.randn(2, 4), torch.tensor([1, 0]))
    assert step.replays == 1 and torch.isfinite(loss)


@pytest.mark.parametrize("warmup", [-2, -1, 1.5, "3", True, None])
def test_a_warmup_that_is_no_count_is_refused(warmup):
    with pytest.raises(ValueError, match=rf"warmup={warmup!r}: expected an integer >= 0"):
        _step(warmup=warmup)
    with pytest.raises(ValueError, match=rf"warmup={warmup!r}: expected an integer >= 0"):
        GraphedEvalStep(nn.Linear(4, 3), torch.randn(2, 4), warmup=warmup, why_not=None, capture_fn=eager_capture)


@pytest.mark.parametrize("warmup", [0, 1, 3])
def test_a_warmup_count_is_taken(warmup):
    assert _step(warmup=warmup).why_not is None


def test_the_eval_step_refuses_a_batch_of_another_dtype():
    step = GraphedEvalStep(nn.Linear(4, 3), torch.randn(2, 4), why_not=None, capture_fn=eager_capture)
    with pytest.raises(ValueError, match=r"inputs of dtype torch.float64 on cpu, but the step was captured"):
        step(torch.randn(2, 4, dtype=torch.float64))
