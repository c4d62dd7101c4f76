"""Initial weights for fine-tuning (``model.checkpoint``), as the authors' ``load_pretrained``.

The authors fine-tune at 384 from their 224 models (``utils.py:38-130``; ``utils_ema.py`` for CSwin,
which starts from the EMA weights). Here, from our checkpoints or the authors':

- the weights: the model's, or with ``ema=True`` the EMA copy (``model_ema`` / ``state_dict_ema``);
- relative position bias tables ``[L, heads]`` of another window: resized bicubically as a
  ``sqrt(L) x sqrt(L)`` grid per head;
- position embeddings ``[1, L, C]`` of another grid: the last ``S * S`` tokens resized bicubically
  as an ``S x S`` grid, the tokens before them (cls) kept;
- a classifier head of another shape: left out and set to zero;
- buffers the model recomputes (relative position indices, shift masks) are taken from the model;
- then the family's checkpoint filter (which maps the authors' key names) and a strict load:
  any other tensor that does not fit is an error naming it, so nothing is left at its random
  initialisation unnoticed.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..models.checkpoint import load_checkpoint, read_state_dict
from ..models.swin import resize_rel_pos_table

log = logging.getLogger(__name__)
PathLike = Union[str, os.PathLike]


@dataclass
class FinetuneReport:
    """What :func:`load_initial_weights` changed on the way: resized tensors (key, file shape, model
    shape) and the head keys set to zero."""

    resized: list[tuple[str, tuple, tuple]] = field(default_factory=list)
    head_reset: list[str] = field(default_factory=list)


def resize_pos_embed_bicubic(pos: torch.Tensor, tokens: int) -> torch.Tensor:
    """[1, L, C] -> [1, tokens, C]: the last S*S tokens as an S x S grid resized bicubically, the
    leading (prefix) tokens of the target taken from the source's start."""
    old, new = math.isqrt(pos.shape[1]), math.isqrt(tokens)
    old_prefix, new_prefix = pos.shape[1] - old * old, tokens - new * new
    if old_prefix != new_prefix:
        raise ValueError(
            f"a position embedding of {pos.shape[1]} tokens cannot be resized to {tokens} "
            f"({old_prefix} vs {new_prefix} tokens before the grid)"
        )
    grid = pos[:, old_prefix:].reshape(1, old, old, -1).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=(new, new), mode="bicubic", align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new * new, -1).to(pos.dtype)
    return torch.cat([pos[:, :new_prefix], grid], dim=1)


def adapt_state_dict(state: dict, model: nn.Module, classifier: Optional[str] = "head") -> tuple[dict, FinetuneReport]:
    """``state`` resized for ``model`` (tables, position embeddings), its mismatched head left out."""
    own = model.state_dict()
    out, report = {}, FinetuneReport()
    for key, value in state.items():
        mine = own.get(key)
        if mine is None or tuple(mine.shape) == tuple(value.shape):
            out[key] = value
            continue
        if classifier and key.startswith(classifier + "."):
            report.head_reset.append(key)
            continue
        if key.endswith("relative_position_bias_table") and value.dim() == 2 and value.shape[1] == mine.shape[1]:
            out[key] = resize_rel_pos_table(value, mine.shape[0])
        elif "pos_embed" in key.rsplit(".", 1)[-1] and value.dim() == 3 and value.shape[2] == mine.shape[2]:
            out[key] = resize_pos_embed_bicubic(value, mine.shape[1])
        else:
            out[key] = value  # the strict load names it
            continue
        report.resized.append((key, tuple(value.shape), tuple(mine.shape)))
    return out, report


def load_initial_weights(
    model: nn.Module, path: PathLike, *, ema: bool = False, classifier: Optional[str] = "head"
) -> FinetuneReport:
    """Initialise ``model`` from the checkpoint at ``path`` for fine-tuning (see the module doc).

    ``classifier`` names the head module (its weight and bias start at zero when their shapes
    differ). Raises ValueError naming the file when it holds no EMA weights (``ema=True``) or
    when a tensor does not fit.
    """
    where = repr(str(path))
    state = read_state_dict(path, weights_only=False, ema=ema)  # ours hold configs besides tensors
    state, report = adapt_state_dict(state, model, classifier)
    if report.head_reset:
        head = model.get_submodule(classifier)
        for name in ("weight", "bias"):
            t = getattr(head, name, None)
            if t is not None:
                nn.init.zeros_(t)
                state[f"{classifier}.{name}"] = t.detach().clone()
    try:
        load_checkpoint(model, state, strict=True)
    except ValueError as e:
        raise ValueError(f"model.checkpoint {where} does not fit {type(model).__name__}: {e}") from None
    log.info(
        "initialised from %s%s: %d tensors resized%s",
        path,
        " (EMA weights)" if ema else "",
        len(report.resized),
        f", head {report.head_reset} set to zero" if report.head_reset else "",
    )
    return report
