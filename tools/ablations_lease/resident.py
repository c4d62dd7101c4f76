"""One ablation run on a device with everything resident: data, augmentation and loss in the captured step.

The ablation models are small (24-96 channels), so a GPU step of the classification trainer is
bound by the host: ~2,000-2,900 kernel launches a step (``launches.py``), plus the augmentation,
the label smoothing, a loss read and a finiteness check outside its graph. Here the step that is
captured once (:class:`~inline_attn.runtime.graphs.GraphedTrainStep`) and replayed takes a batch
of *indices*: the gather from Fashion-MNIST held on the device as uint8, the resize to the task's
56 px, the per-image flip (drawn on the device, so each replay draws anew), the normalisation, the
model, the label-smoothed cross-entropy, backward, clipping and AdamW are all inside it. A step on
the host is then: copy the indices in, replay, keep the loss on the device, write the learning
rate into the optimizer's tensor lr. Nothing is read back until a curve point (a few per run).

The recipe is the classification trainer's (:func:`inline_attn.train.task.train`) for the
locality task: the same model and initialisation (seeded the same way), the same batch order
(the sampler's permutation of ``seed + epoch``), AdamW with the recipe's learning rate, timm's
cosine schedule, clipping, label smoothing, the flip with its probability, evaluation through
the trainer's evaluation transform. What differs: the flips are drawn from the device's
generator, and a run that turns non-finite is found at the next curve point, not at its step.
Configs with anything more (mixup, crops, RandAugment, an EMA, fp16, accumulation) are refused,
naming the setting.

``capture_fn``: how the step is captured, :func:`~inline_attn.runtime.graphs.capture` on a GPU;
the CPU tests pass :func:`~inline_attn.runtime.graphs.eager_capture` (the same code path, the
graph replaced by eager execution). Off CUDA without it the plain step runs.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from inline_attn.data import EvalTransform
from inline_attn.data.fmnist import load_fashion_mnist
from inline_attn.data.mixup import smooth_one_hot
from inline_attn.data.transforms import Normalize, to_float
from inline_attn.models import get_model_config
from inline_attn.models.profile import profile
from inline_attn.runtime.graphs import GraphedEvalStep, GraphedTrainStep, capture, why_not_graphed
from inline_attn.runtime.optim import CosineSchedule, build_optimizer, prepare_for_capture
from inline_attn.train.config import Config
from inline_attn.train.data import data_info
from inline_attn.train.task import build_model
from inline_attn.train.recipe import resolve

EVAL_BATCH = 1000  # evaluation batches: 10 for the 10,000 test images, one graph each way
GRAPH_CHECK_RTOL = 1e-3  # graph_check: the replayed step's losses against the plain step's
PLAIN = object()  # ResidentRun's capture_fn for the plain step on any device (the graph check's reference)


def check_resident_recipe(cfg: Config) -> None:
    """ValueError naming the first setting the resident step does not implement."""
    a, o, t = cfg.aug, cfg.optim, cfg.train
    unsupported = {
        "data.dataset": (cfg.data.dataset, "fmnist"),
        "aug.crop": (a.crop, "none"),
        "aug.auto_augment": (a.auto_augment, None),
        "aug.color_jitter": (a.color_jitter, None),
        "aug.re_prob": (a.re_prob, 0.0),
        "aug.mixup": (a.mixup, 0.0),
        "aug.cutmix": (a.cutmix, 0.0),
        "optim.opt": (o.opt, "adamw"),
        "optim.accum_steps": (o.accum_steps, 1),
        "optim.total_batch": (o.total_batch, None),
        "train.ema": (t.ema, False),
        "train.amp": (t.amp, "none"),
        "model.drop_path": (cfg.model.drop_path, 0.0),
        "sched.cooldown_epochs": (cfg.sched.cooldown_epochs, 0),
    }
    for key, (value, wanted) in unsupported.items():
        if value != wanted and not (wanted is None and not value):
            raise ValueError(f"{key}={value!r}: the resident ablation step implements only {key}={wanted!r}")


@dataclass
class ResidentData:
    """Fashion-MNIST on one device: uint8 images [N, 1, 28, 28] and int64 labels, train and test."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    val_images: torch.Tensor
    val_labels: torch.Tensor

    @classmethod
    def load(cls, path, subset: int, val_subset: int, device: torch.device) -> "ResidentData":
        """``subset`` / ``val_subset``: the runs' data.subset and data.val_subset (0: all); more
        images than a split holds are refused, naming both numbers."""
        tr = load_fashion_mnist(path, "train").subset(
            subset, "Fashion-MNIST's training split", setting="data.subset", split="training"
        )
        va = load_fashion_mnist(path, "test").subset(
            val_subset, "Fashion-MNIST's test split", setting="data.val_subset", split="validation"
        )
        return cls(*(t.to(device) for t in (tr.images, tr.labels, va.images, va.labels)))


class FlipResize(nn.Module):
    """uint8 [B, C, h, w] -> float [B, C, size, size]: bilinear resize, each image flipped left-right
    with probability ``hflip`` (drawn on the images' device), clamped to [0, 1], normalised: the
    locality task's :class:`~inline_attn.data.TrainAugment` (crop "none", no RandAugment, no erasing)."""

    def __init__(self, size: int, mean, std, hflip: float):
        super().__init__()
        self.size, self.hflip = size, float(hflip)
        self.normalize = Normalize(mean, std)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = to_float(x)
        if x.shape[-2:] != (self.size, self.size):
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        if self.hflip > 0:
            flip = torch.rand(x.shape[0], device=x.device) < self.hflip
            x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
        return self.normalize(x.clamp(0, 1))


class IndexedModel(nn.Module):
    """``net(transform(images[idx]))``: a batch given by its indices into resident images, so the
    gather and the transform sit inside the captured step. ``images`` is a plain attribute (not
    in the state dict: the warm-up's save and restore copies only the net)."""

    def __init__(self, net: nn.Module, transform: nn.Module, images: torch.Tensor):
        super().__init__()
        self.net, self.transform, self.images = net, transform, images

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.net(self.transform(self.images[idx]))


def seed_everything(seed: int) -> None:
    """The classification trainer's seeding (Python, NumPy, torch), so a seed gives the same initial weights."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_order(n: int, seed: int, epoch: int, batch: int) -> torch.Tensor:
    """[steps, batch] indices of one epoch: the sampler's permutation of ``seed + epoch`` (one
    process, last partial batch dropped), as the trainer's batches."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=g)
    steps = n // batch
    return perm[: steps * batch].view(steps, batch)


@dataclass
class RunClock:
    """Where a run's wall time went, in seconds."""

    build_s: float = 0.0
    capture_s: float = 0.0
    train_s: float = 0.0
    eval_s: float = 0.0


def _curve_steps(total: int, points: int) -> list[int]:
    """The steps (counted from 1) after which the curve is read: ``points`` evenly, the last at ``total``."""
    return sorted({max(1, round(total * (i + 1) / points)) for i in range(max(points, 1))})


def _labelled_loss(labels: torch.Tensor, num_classes: int, smoothing: float):
    def loss_fn(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        target = smooth_one_hot(labels[idx], num_classes, smoothing)
        return torch.sum(-target * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()

    return loss_fn


def evaluate_resident(model: nn.Module, forward: Callable, n: int, batch: int, labels: torch.Tensor) -> float:
    """Top-1 (%) of ``forward(idx)`` over the first ``n`` resident test images, counted on the device."""
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=labels.device)
    for start in range(0, n, batch):
        idx = torch.arange(start, min(start + batch, n), device=labels.device)
        correct += (forward(idx).argmax(-1) == labels[idx]).sum()
    model.train()
    return 100.0 * correct.item() / max(n, 1)


class ResidentRun:
    """One run of ``cfg`` on resident ``data``: built by the constructor, trained by :meth:`train`.

    ``capture_fn``: None captures with :func:`~inline_attn.runtime.graphs.capture` where a graph
    can run (CUDA) and runs the plain step elsewhere; a function (the tests'
    :func:`~inline_attn.runtime.graphs.eager_capture`) is used on any device; :data:`PLAIN` runs
    the plain step everywhere."""

    def __init__(self, cfg: Config, data: ResidentData, device: torch.device, capture_fn: Optional[Callable] = None):
        check_resident_recipe(cfg)
        self.cfg, self.data, self.device, self.clock = cfg, data, torch.device(device), RunClock()
        t0 = time.perf_counter()
        seed_everything(cfg.train.seed)
        info = data_info(cfg.data, get_model_config(cfg.model.name)).with_classes(10)
        self.net = build_model(cfg, info).to(self.device)
        recipe, o, s = resolve(cfg, 1), cfg.optim, cfg.sched
        self.optimizer = build_optimizer(self.net, o.opt, recipe.lr, o.weight_decay, o.betas, o.eps, o.no_weight_decay)
        self.batch = cfg.data.batch_size
        self.steps_per_epoch = len(data.train_labels) // self.batch
        if self.steps_per_epoch < 1:
            raise ValueError(f"{len(data.train_labels)} training images are fewer than one batch ({self.batch})")
        self.sched = CosineSchedule(
            self.optimizer,
            lr=recipe.lr,
            steps_per_epoch=self.steps_per_epoch,
            epochs=s.epochs,
            warmup_epochs=s.warmup_epochs,
            warmup_lr=recipe.warmup_lr,
            min_lr=recipe.min_lr,
        )
        augment = FlipResize(info.img_size, info.mean, info.std, cfg.aug.hflip).to(self.device)
        self.train_model = IndexedModel(self.net, augment, data.train_images)
        evaluate = EvalTransform(
            info.img_size, info.mean, info.std, info.crop_pct, info.interpolation, info.eval_resize
        )
        self.eval_model = IndexedModel(self.net, evaluate.to(self.device), data.val_images)
        self.loss_fn = _labelled_loss(data.train_labels, info.num_classes, cfg.aug.smoothing)
        if capture_fn is None and self.device.type == "cuda":
            capture_fn = capture
        self.capture_fn = None if capture_fn is PLAIN else capture_fn
        if capture_fn is PLAIN:
            self.why_not = "the plain step, asked for"
        elif capture_fn is None:  # off the GPU without the tests' stand-in: the plain step, saying why
            self.why_not = why_not_graphed(self.device)
        elif self.device.type == "cuda":
            prepare_for_capture(self.optimizer)  # the lr a tensor the schedule writes, AdamW's step on the device
            self.why_not = why_not_graphed(self.device, model=self.train_model, optimizer=self.optimizer)
        else:  # the tests' eager stand-in: the same path off the GPU (a capturable AdamW runs on CUDA only)
            self.why_not = None
        self.step_fn: Optional[GraphedTrainStep] = None
        self.eval_fn: Optional[GraphedEvalStep] = None
        self.clock.build_s = time.perf_counter() - t0

    def _capture_kw(self) -> dict:
        kw = {"why_not": self.why_not}
        return kw if self.capture_fn is None else {**kw, "capture_fn": self.capture_fn}

    def _first_step(self, idx: torch.Tensor) -> None:
        t0 = time.perf_counter()
        kw = dict(clip_grad=self.cfg.optim.clip_grad, **self._capture_kw())
        self.step_fn = GraphedTrainStep(self.train_model, self.optimizer, self.loss_fn, idx, idx, **kw)
        self.clock.capture_s += time.perf_counter() - t0

    def top1(self, n: int) -> float:
        """Top-1 (%) on the first ``n`` test images (the evaluation forward captured at its first call)."""
        t0 = time.perf_counter()
        self.net.eval()
        if self.eval_fn is None:
            example = torch.arange(min(EVAL_BATCH, n), device=self.device)
            self.eval_fn = GraphedEvalStep(self.eval_model, example, warmup=2, **self._capture_kw())
        top1 = evaluate_resident(self.net, self.eval_fn, n, EVAL_BATCH, self.data.val_labels)
        self.clock.eval_s += time.perf_counter() - t0
        return top1

    def train(self, curve_points: int = 8, curve_images: int = 2000) -> dict:
        """Train every step, reading the curve ``curve_points`` times (mean training loss of the
        steps since the last point; top-1 on the first ``curve_images`` test images, on all of
        them at the end) -> the run's numbers (``top1`` None and ``diverged`` when the loss
        turned non-finite)."""
        epochs, spe, dev = self.cfg.sched.epochs, self.steps_per_epoch, self.device
        total = epochs * spe
        losses = torch.zeros(total, device=dev)  # written on the device a step, read at curve points
        points = set(_curve_steps(total, curve_points))
        curve: dict = {"images": [], "train_loss": [], "val_top1": []}
        step, last, n_val = 0, 0, len(self.data.val_labels)
        t_seg = time.perf_counter()
        for epoch in range(epochs):
            order = epoch_order(len(self.data.train_labels), self.cfg.train.seed, epoch, self.batch).to(dev)
            for i in range(spe):
                if self.step_fn is None:
                    self._first_step(order[i])
                    t_seg = time.perf_counter()
                losses[step].copy_(self.step_fn(order[i], order[i]))
                step += 1
                self.sched.step()
                if step not in points:
                    continue
                seg_loss = losses[last:step].mean().item()  # the one sync of the segment
                self.clock.train_s += time.perf_counter() - t_seg
                last = step
                if not math.isfinite(seg_loss):
                    return self._numbers(curve, total, diverged=f"training loss not finite by step {step} of {total}")
                curve["images"].append(step * self.batch)
                curve["train_loss"].append(round(seg_loss, 4))
                curve["val_top1"].append(round(self.top1(n_val if step == total else min(curve_images, n_val)), 2))
                t_seg = time.perf_counter()
        return self._numbers(curve, total)

    def _numbers(self, curve: dict, total: int, diverged: Optional[str] = None) -> dict:
        c, step = self.clock, self.step_fn
        why_not = self.why_not if step is None else step.why_not
        done = len(curve["images"]) and curve["images"][-1] // self.batch
        out = {
            "top1": None if diverged or not curve["val_top1"] else curve["val_top1"][-1],
            "params": sum(p.numel() for p in self.net.parameters()),
            "steps": total,
            "images_per_run": total * self.batch,
            "train_img_s": round(done * self.batch / c.train_s, 1) if c.train_s > 0 else None,
            "step_ms": round(1000 * c.train_s / done, 3) if done else None,
            "seconds": {k: round(v, 3) for k, v in vars(c).items()},
            "curve": curve,
            "device": _device_name(self.device),
            "graphed": why_not is None and self.capture_fn is not None,
            "why_not": why_not,
            "replays": 0 if step is None else step.replays,
        }
        if diverged:
            out["diverged"] = diverged
        return out


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({torch.get_num_threads()} threads)"


def model_macs(cfg: Config) -> Optional[int]:
    """MACs of one forward of ``cfg``'s model on one image (on the CPU: the count does not depend on the device)."""
    info = data_info(cfg.data, get_model_config(cfg.model.name)).with_classes(10)
    try:
        return profile(build_model(cfg, info), (info.in_chans, info.img_size, info.img_size)).macs
    except Exception:  # noqa: BLE001 - a count is a report, never a reason to lose a run
        return None


def graph_check(cfg: Config, data: ResidentData, device, capture_fn: Optional[Callable] = None, steps: int = 4) -> dict:
    """The replayed step against the plain step, before a campaign trusts its graphs.

    ``cfg`` (its flip off: the warm-up before capture would otherwise draw other flips) trains
    ``steps`` batches of ``data`` both ways; their per-step training losses must agree within
    :data:`GRAPH_CHECK_RTOL` (the graphed AdamW reads its learning rate from a device tensor:
    close, not bitwise). And the flip, replayed twice from one graph, must draw anew (a draw baked
    into the graph would flip the same images every step). A step that could not be captured is
    not a failure: the runs go ungraphed, slower, each record saying why.
    -> {"graphed", "why_not", "max_rel_diff", "flips_redrawn" (None ungraphed), "ok"}.
    """
    batch = cfg.data.batch_size
    steps = min(steps, len(data.train_labels) // batch)
    n = steps * batch
    small = ResidentData(data.train_images[:n], data.train_labels[:n], data.val_images[:batch], data.val_labels[:batch])
    graphed = ResidentRun(cfg, small, device, capture_fn).train(curve_points=steps, curve_images=batch)
    plain = ResidentRun(cfg, small, device, PLAIN).train(curve_points=steps, curve_images=batch)
    losses = zip(graphed["curve"]["train_loss"], plain["curve"]["train_loss"])
    diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in losses]
    max_diff = max(diffs) if len(diffs) == steps else float("inf")
    out = {"graphed": graphed["graphed"], "why_not": graphed["why_not"], "max_rel_diff": max_diff}
    if not graphed["graphed"]:  # no graph: the runs go ungraphed (slower, each record says why), not wrong
        return {**out, "flips_redrawn": None, "ok": True}
    flip = FlipResize(2 * data.train_images.shape[-1], (0.5,), (0.5,), 0.5).to(device)
    x = data.train_images[:batch].clone()
    replay, _ = (capture_fn or capture)(lambda: flip(x), warmup=1)
    first = replay().clone()
    redrawn = not torch.equal(first, replay())
    return {**out, "flips_redrawn": redrawn, "ok": redrawn and max_diff <= GRAPH_CHECK_RTOL}
