"""What segmentation and detection share around the run (:mod:`inline_attn.runtime.run`): the
model built from a dense config, whole-model weights loaded strictly, a trained model rebuilt from
its run's checkpoint, and :class:`DenseTask`, the iteration-based hooks both tasks take (AdamW /
SGD with the poly schedule, the cadence in iterations, the images normalised, the backbone in the
summary, the classes in the checkpoint)."""

from __future__ import annotations

from typing import Callable

import torch.nn as nn

from ..data.transforms import Normalize
from .._io import read_checkpoint
from ..models.checkpoint import unwrap_state_dict
from ..runtime.config import TypedConfig
from ..runtime.task import Cadence
from ..runtime.optim import PolySchedule, build_optimizer
from ..runtime.task import Task

__all__ = ["DenseTask", "build_dense_model", "load_trained", "load_weights"]


def build_dense_model(cfg: TypedConfig, num_classes: int, builder: Callable, head_key: str) -> nn.Module:
    """``builder(backbone=..., num_classes=..., backbone_kwargs=..., **head settings)`` for the
    config's model section (weights from ``model.checkpoint`` when set; the backbone's from
    ``model.pretrained``); ``head_key`` names the classifier weight for mismatch messages."""
    m = cfg.model
    if m.num_classes is not None and m.num_classes != num_classes:
        raise ValueError(f"model.num_classes={m.num_classes} but the dataset has {num_classes} classes")
    try:
        model = builder(
            backbone=m.backbone,
            num_classes=num_classes,
            backbone_kwargs=m.backbone_kwargs_for_build(),
            **m.head_kwargs(),
        )
    except TypeError as e:  # a backbone_kwargs entry the model does not take
        raise ValueError(f"backbone {m.backbone!r} rejected model.backbone_kwargs {m.backbone_kwargs}: {e}") from e
    if m.checkpoint:
        load_weights(model, m.checkpoint, head_key)
    return model


def load_weights(model: nn.Module, path, head_key: str) -> None:
    """Load whole-model weights (a ``last.pth`` of ours or a bare state dict), strictly: a
    checkpoint of another backbone or class count (the rows of ``head_key``, the classifier's
    weight) raises ValueError saying which."""
    sd = unwrap_state_dict(read_checkpoint(path, weights_only=False), where=repr(str(path)))
    own = model.state_dict()
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    shapes = [
        f"{k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in sd and sd[k].shape != own[k].shape
    ]
    if missing or unexpected or shapes:
        cls = own[head_key].shape[0]
        got = sd.get(head_key)
        hint = (
            f"; the checkpoint predicts {got.shape[0]} classes, the model {cls}"
            if got is not None and got.shape[0] != cls
            else ""
        )
        raise ValueError(
            f"checkpoint {path} does not fit the model (other backbone or head?){hint}: "
            f"{len(missing)} missing (e.g. {missing[:3]}), {len(unexpected)} unexpected "
            f"(e.g. {unexpected[:3]}), {len(shapes)} of another shape (e.g. {shapes[:2]})"
        )
    model.load_state_dict(sd)


def load_trained(task: "DenseTask", path, state: dict, device="cpu") -> tuple[nn.Module, TypedConfig]:
    """(model, config) of the run that wrote ``state``, the checkpoint read from ``path``: its
    config without the starting weights (``model.checkpoint``, ``model.pretrained``), the model
    built for its class count, the trained weights loaded strictly, on ``device``."""
    cfg = task.config.from_dict(state["config"]).replace(**{"model.checkpoint": None, "model.pretrained": None})
    model = task.build_model(cfg, int(state["num_classes"]))
    load_weights(model, path, task.head_key)
    return model.to(device), cfg


class DenseTask(Task):
    """The hooks segmentation and detection share: a checkpoint of ``checkpoint_keys`` with the
    classes, the optimizer with the poly schedule, a cadence in iterations, normalised images,
    the backbone at the head of the summary, the metrics rounded to 2 digits in a row, the
    BatchNorm synchronised over GPU processes."""

    head_key: str  # the classifier's weight (its rows: the classes), for mismatch messages
    extras: dict = {}  # saved in every checkpoint beside the classes
    metric_digits = 2
    sync_bn = True

    def extra_state(self, run) -> dict:
        """The classes the model predicts (an evaluation rebuilds it from them) and :attr:`extras`."""
        return {"num_classes": run.train_set.num_classes, "classes": list(run.train_set.classes), **self.extras}

    def load_extra_state(self, run, where: str, state: dict) -> None:
        """The checkpoint's model predicts the classes of this run's data."""
        saved, now = state.get("num_classes"), run.train_set.num_classes
        if saved is not None and int(saved) != now:
            raise ValueError(
                f"cannot resume from {where}: its model predicts {saved} classes, the training data has {now}; "
                "train on the data it was trained on, or start a new run (another train.output)"
            )

    def optimization(self, cfg, model: nn.Module) -> tuple:
        o, s = cfg.optim, cfg.sched
        optimizer = build_optimizer(model, o.opt, o.lr, o.weight_decay, o.betas, o.eps)
        sched = PolySchedule(
            optimizer,
            lr=o.lr,
            iters=s.iters,
            power=s.power,
            min_lr=s.min_lr,
            warmup_iters=s.warmup_iters,
            warmup_ratio=s.warmup_ratio,
        )
        return optimizer, sched, None  # no EMA

    def cadence(self, cfg) -> Cadence:
        t = cfg.train
        return Cadence(cfg.sched.iters, t.log_interval, cfg.eval.interval, t.checkpoint_interval, t.max_steps)

    def input_norm(self, cfg) -> nn.Module:
        return Normalize(cfg.data.mean, cfg.data.std)

    def headline(self, cfg) -> dict:
        return {"backbone": cfg.model.backbone}
