"""The one check that evaluation scores only finite model outputs.

A model with NaN or inf weights returns NaN logits / probabilities; argmax, thresholds and
top-k then turn them into a plausible score (all background, no detections, class 0). Every
task's evaluation checks the outputs first and stops with :class:`NonFiniteOutputs`, whose
message names the model's source (the checkpoint).
"""

from __future__ import annotations

import torch

__all__ = ["NonFiniteOutputs", "check_finite", "require_finite", "require_finite_weights"]


class NonFiniteOutputs(ValueError):
    """A model's outputs hold NaN or inf: it is not scored."""


def require_finite(t: torch.Tensor, source: str, what: str) -> None:
    """NonFiniteOutputs naming ``source`` (e.g. ``"checkpoint runs/x/last.pth"``) and ``what``
    (e.g. ``"logits"``) when ``t`` holds a NaN or an inf."""
    finite = torch.isfinite(t)
    if not bool(finite.all()):
        bad = int(finite.numel() - finite.sum())
        raise NonFiniteOutputs(
            f"{source}: {bad} of the model's {finite.numel()} {what} are NaN or inf; a model whose outputs are not "
            "finite is not scored (are its weights finite?)"
        )


def require_finite_weights(model: torch.nn.Module, source: str) -> None:
    """NonFiniteOutputs naming ``source`` and the first parameter or buffer holding a NaN or an inf:
    an analysis of such a model would report a plausible-looking number (a ratio of nan, "injective")."""
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise NonFiniteOutputs(
                f"{source}: {bad} of the {t.numel()} values of {name} are NaN or inf; a model with non-finite "
                "weights is not analysed (a diverged run? take an earlier checkpoint)"
            )


def check_finite(loss: torch.Tensor, where: str) -> None:
    """A non-finite loss stops the run, naming where (``iteration 12``)."""
    if not torch.isfinite(loss):
        raise FloatingPointError(f"loss is {loss.item()} at {where}")
