"""The reader of a classification run's checkpoint. The format, its writing, rotation, the best
copies, resume and its checks are the run's (:mod:`inline_attn.runtime.run`,
:mod:`inline_attn.runtime.checkpoint`); classification adds where the epoch stands (``epoch``,
``step_in_epoch``, ``steps_per_epoch``) and what evaluation needs to rebuild the model
(``model_name``, ``model_kwargs``, ``pretrained_cfg``).
"""

from __future__ import annotations

from ..runtime.checkpoint import RUN_KEYS, PathLike, read_run_checkpoint

__all__ = ["load"]

KEYS = RUN_KEYS + ("epoch", "step_in_epoch")  # ClassifyTask.checkpoint_keys beside the run's


def load(path: PathLike) -> dict:
    """A checkpoint of a classification run (ValueError naming the file when it is not one)."""
    return read_run_checkpoint(path, KEYS, "classification")
