"""The loop every data-driven analysis shares: forward batches with an attention hook installed.

Weights are only ever seen by the hook, one call at a time (:func:`inline_attn.hook_attention`);
the analyses reduce them on the spot, so no more than one layer's N x N matrix is alive.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch
import torch.nn as nn

from ..layers.record import attention_layers, hook_attention
from ..runtime.progress import progress_bar


def map_sizes_for(model: nn.Module, input_hw) -> dict[str, tuple[int, int]]:
    """{attention layer name: (H, W) of its stage's feature map} for an input of ``input_hw``.

    Uses the model contract's ``feature_info`` (module name + reduction per stage): a layer
    belongs to the stage whose module name prefixes its own. Layers of models without
    ``feature_info`` are left out (the analyses then fall back to the coordinates' extent).
    """
    info = getattr(model, "feature_info", None)
    if not info:
        return {}
    h, w = (int(s) for s in input_hw)
    out = {}
    for name, _ in attention_layers(model):
        for stage in info:
            mod = stage.get("module") if isinstance(stage, dict) else None
            red = stage.get("reduction") if isinstance(stage, dict) else None
            if mod and red and (name == mod or name.startswith(mod + ".")):
                out[name] = (-(-h // int(red)), -(-w // int(red)))
                break
    return out


def run_hooked(
    model: nn.Module,
    batches: Iterable,
    per_batch: Callable,
    after_batch: Optional[Callable] = None,
    *,
    layers=None,
    progress: bool = True,
    desc: str = "analysis",
) -> None:
    """For each ``(x, y, ...)`` in ``batches``: ``hook = per_batch(x, y, chosen)``, run
    ``model(x)`` with ``hook`` installed on ``layers``, then ``after_batch(x, y, logits)``.

    ``chosen`` is the list of (index, name, module) the hook covers. Runs in eval mode under
    ``torch.no_grad`` on the model's device; the model's train/eval state is restored.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total = len(batches) if hasattr(batches, "__len__") else None
    from ..layers.record import select_layers

    chosen = select_layers(attention_layers(model), layers)
    if not chosen:
        raise ValueError(f"{type(model).__name__} has no attention layers to analyse")
    try:
        with torch.no_grad():
            for batch in progress_bar(batches, total=total, desc=desc, progress=progress, leave=False):
                x, y = batch[0].to(device), batch[1]
                hook = per_batch(x, y, chosen)
                with hook_attention(model, hook, layers=layers):
                    out = model(x)
                if after_batch is not None:
                    after_batch(x, y, out)
    finally:
        model.train(was_training)
