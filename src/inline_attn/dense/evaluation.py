"""What a checkpoint evaluation of either dense task checks before it scores anything.

:func:`inline_attn.dense.seg_task.evaluate_checkpoint` and
:func:`inline_attn.dense.det_task.evaluate_checkpoint` share these: the model is the checkpoint's
(overrides may change the data and evaluation settings, not the model), and it scores only data
with its own class count.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..runtime.config import TypedConfig


def eval_config(
    cfg: TypedConfig, overrides: Iterable[tuple[str, Any]], task: str, *, reads: tuple[str, ...] = ()
) -> TypedConfig:
    """The checkpoint's config with ``overrides`` (dotted keys) applied. A ``model.*`` key cannot
    change a model already built from the checkpoint (it used to be accepted, ignored and printed
    as if it had been applied), and the training sections (``optim``, ``sched``, ``train``; but the
    keys in ``reads``) are not read by an evaluation: both are refused with a ``ValueError``."""
    overrides = list(overrides)
    model_keys = [key for key, _ in overrides if key.split(".")[0] == "model"]
    if model_keys:
        raise ValueError(
            f"{task} eval builds the model from the checkpoint: --{', --'.join(model_keys)} cannot change it "
            "(train or fine-tune with --model.checkpoint for another model)"
        )
    unread = [key for key, _ in overrides if key.split(".")[0] not in ("data", "eval") and key not in reads]
    if unread:
        more = f" and {', '.join(reads)}" if reads else ""
        raise ValueError(
            f"--{', --'.join(unread)}: {task} eval reads only the data and eval settings{more}; "
            "that setting changes nothing in it"
        )
    return cfg.replace(**dict(overrides))


def check_class_count(model, val, checkpoint) -> None:
    """A checkpoint scores only data with its own class count (an 11-class model on 150-class
    ADE20K used to be scored without a word)."""
    if int(model.num_classes) != int(val.num_classes):
        raise ValueError(
            f"checkpoint {checkpoint} predicts {model.num_classes} classes, the evaluation data has "
            f"{val.num_classes}: evaluate it on the data it was trained for (--data.dataset / --data.path)"
        )


__all__ = ["check_class_count", "eval_config"]
