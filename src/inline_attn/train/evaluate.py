"""Classification's loss and evaluation: :func:`soft_cross_entropy`, :func:`accuracy_counts`, one
evaluation pass (:func:`evaluate`, any number of processes), the evaluation of trained
checkpoints, and rebuilding a trained model from its checkpoint."""

from __future__ import annotations

import json
import os
import pathlib
import time
from typing import Callable, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data import DataInfo, EvalTransform, check_class_count, open_eval_source, parse_source, resolve_data_info
from ..models import create_model, get_model_config
from .._io import read_checkpoint
from ..models.checkpoint import load_checkpoint, unwrap_state_dict
from ..models.pretrained import CONFIG_NAME, pretrained_model_spec
from ..runtime.checkpoint import BEST, LAST
from .data import Batches
from ..runtime.amp import autocast
from ..runtime.distributed import DistInfo, all_reduce_sum, resolve_device
from ..runtime.finite import require_finite
from ..runtime.output import REPLACED_PREFIX

PathLike = Union[str, os.PathLike]


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """logits: [B, K], target: [B, K] probabilities -> mean over the batch of -sum t log p."""
    return torch.sum(-target * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()


def accuracy_counts(logits: torch.Tensor, target: torch.Tensor, topk=(1, 5)) -> list[int]:
    """Number of samples whose label is among the top-k logits, for each k (k capped at K)."""
    maxk = min(max(topk), logits.shape[-1])
    pred = logits.topk(maxk, dim=-1).indices  # [B, maxk]
    hit = pred.eq(target.view(-1, 1))
    return [int(hit[:, : min(k, maxk)].any(dim=1).sum()) for k in topk]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Batches,
    transform: nn.Module,
    device: torch.device,
    info: Optional[DistInfo] = None,
    amp: str = "none",
    forward: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    source: str = "the model",
) -> dict:
    """Top-1 / top-5 accuracy (%) and mean cross-entropy over the readable samples, summed across
    ranks; ``n`` counts the images scored and ``n_unreadable`` the ones that could not be read.
    ``forward``: what computes the logits of a batch instead of ``model(x)`` (a CUDA-graphed
    forward of ``model``, :meth:`inline_attn.runtime.graphs.StepGraphs.eval_forward`). Non-finite
    logits raise :class:`~inline_attn.runtime.finite.NonFiniteOutputs` naming ``source``."""
    info = info or DistInfo()
    was_training = model.training
    model.eval()
    sums = torch.zeros(5, dtype=torch.float64)  # loss sum, top1, top5, n, unreadable
    for x, y in batches.iterate():
        x = transform(x.to(device, non_blocking=True))
        y = y.to(device)
        with autocast(device, amp):
            logits = model(x) if forward is None else forward(x)
        logits = logits.float()
        require_finite(logits, source, "logits")
        t1, t5 = accuracy_counts(logits, y)
        sums[:4] += torch.tensor(
            [float(F.cross_entropy(logits, y, reduction="sum")), t1, t5, y.numel()], dtype=torch.float64
        )
    sums[4] = batches.unreadable
    model.train(was_training)
    all_reduce_sum(sums, info)
    n = max(sums[3].item(), 1.0)
    return {
        "loss": sums[0].item() / n,
        "top1": 100.0 * sums[1].item() / n,
        "top5": 100.0 * sums[2].item() / n,
        "n": int(sums[3].item()),
        "n_unreadable": int(sums[4].item()),
    }


# A run folder's checkpoint to rebuild from: the trainer's best, then the names other trainers give
# theirs (timm's model_best, ...) and the trainer's last; else the newest checkpoint file in it.
RUN_CHECKPOINT_STEMS = (
    pathlib.Path(BEST).stem,
    "model_best",
    "checkpoint_best",
    "final",
    pathlib.Path(LAST).stem,
    "latest",
    "checkpoint",
)
CHECKPOINT_SUFFIXES = (".pth", ".pt", ".ckpt", ".safetensors")
RUN_CONFIG_NAMES = ("config.yaml", "config.yml")


def run_checkpoint(run_dir: PathLike) -> pathlib.Path:
    """The checkpoint file a training run folder is rebuilt from (:data:`RUN_CHECKPOINT_STEMS`);
    never one of a run that ``--overwrite`` moved into a ``replaced-*`` subfolder (name that folder
    to read it)."""
    run_dir = pathlib.Path(run_dir)
    files = [
        p
        for p in run_dir.rglob("*")
        if p.is_file()
        and p.suffix in CHECKPOINT_SUFFIXES
        and not any(part.startswith(REPLACED_PREFIX) for part in p.relative_to(run_dir).parts[:-1])
    ]
    if not files:
        replaced = sorted(p.name for p in run_dir.glob(f"{REPLACED_PREFIX}*") if p.is_dir())
        moved = f"; earlier runs were moved into {', '.join(replaced)}: name one of those folders" if replaced else ""
        raise ValueError(f"run folder {run_dir} holds no checkpoint ({', '.join(CHECKPOINT_SUFFIXES)}){moved}")
    for stem in RUN_CHECKPOINT_STEMS:
        hits = [p for p in files if p.stem == stem]
        if hits:
            return sorted(hits)[0]
    return max(files, key=lambda p: p.stat().st_mtime)


def load_trained_model(
    checkpoint: PathLike, *, model: Optional[str] = None, ema: bool = False, **overrides
) -> tuple[nn.Module, dict]:
    """Rebuild the model a checkpoint was trained with and load its weights (eval mode).

    ``checkpoint`` is a checkpoint file, a training run folder (:func:`run_checkpoint` picks its
    file) or a ``save_pretrained`` folder (its ``config.json`` names the model and its arguments).
    Our checkpoints record ``model_name`` and ``model_kwargs`` (the constructor overrides, e.g. a
    28 x 28 one-channel DeiT for Fashion-MNIST); ``overrides`` replace them. A ``model`` other than
    the one the checkpoint, its run's ``config.yaml`` or the folder's ``config.json`` names is
    refused, naming both. A foreign checkpoint (``{"model": ...}``, ``{"state_dict": ...}``, a bare
    state dict or a ``.safetensors`` file) needs ``model``. Loading is strict; errors name the file.

    Returns ``(model, record)``: the checkpoint dict ({} for weights alone) with ``model_name`` and
    ``model_kwargs`` as built, ``config`` (the run's, when known) and ``path`` (the file read).
    """
    path = pathlib.Path(checkpoint)
    run, pretrained = {}, {}
    if (path / CONFIG_NAME).is_file():  # a save_pretrained folder: its config.json names the model
        architecture, args, path = pretrained_model_spec(path)
        pretrained = {"model_name": architecture, "model_kwargs": args}
    elif path.is_dir():
        run = _run_config(path)
        path = run_checkpoint(path)
    elif not path.is_file():
        raise ValueError(
            f"checkpoint file {str(path)!r} does not exist (expected a file, a training run folder or a "
            "save_pretrained folder)"
        )
    where = repr(str(path))
    ckpt = read_checkpoint(path, weights_only=False)  # a file the user names; ours hold configs
    record = dict(ckpt) if isinstance(ckpt, dict) and "model_name" in ckpt else {}
    record.update(pretrained)
    recorded, kwargs = record.get("model_name"), dict(record.get("model_kwargs") or {})
    state = unwrap_state_dict(ckpt, ema=ema, where=where)
    run_model = run.get("model") if isinstance(run.get("model"), dict) else {}
    if model is not None and run_model.get("name") not in (None, model):
        raise ValueError(f"--model {model!r} but run folder {checkpoint} trained {run_model['name']!r}")
    if model is not None and recorded not in (None, model):  # its weights are another model's
        named_by = f"{checkpoint}/{CONFIG_NAME}" if pretrained else f"checkpoint {where}"
        raise ValueError(f"--model {model!r} but {named_by} names model {recorded!r}: leave --model out")
    name = model or recorded
    if name is None:
        raise ValueError(f"checkpoint {checkpoint} does not record its model: pass --model NAME")
    kwargs = {**kwargs, **overrides}
    net = create_model(name, **kwargs)
    # the family's key filter maps the authors' checkpoints; a mismatch is a ValueError naming the keys
    _load_into(net, state, where)
    record.update(model_name=name, model_kwargs=kwargs, path=path)
    if run and "config" not in record:
        record["config"] = run
    return net.eval(), record


def _run_config(run_dir: pathlib.Path) -> dict:
    """A training run's resolved ``config.yaml`` as a dict ({} when the folder has none)."""
    import yaml

    for name in RUN_CONFIG_NAMES:
        path = run_dir / name
        if path.is_file():
            try:
                data = yaml.safe_load(path.read_text()) or {}
            except yaml.YAMLError as e:
                raise ValueError(f"run config {path} is not valid YAML: {str(e).splitlines()[0]}") from None
            if not isinstance(data, dict):
                raise ValueError(f"run config {path} must hold a mapping, got {type(data).__name__}")
            return data
    return {}


def trained_data_info(
    record: dict,
    *,
    fmnist: Optional[bool] = None,
    img_size: Optional[int] = None,
    crop_pct: Optional[float] = None,
    eval_resize: Optional[str] = None,
) -> DataInfo:
    """Input size, normalisation and eval resize of a trained model (a ``record`` of
    :func:`load_trained_model`): the run's data settings, else the dataset's (``fmnist``, by default
    the run's), else the model's; the arguments override them."""
    saved = (record.get("config") or {}).get("data") or {}
    kw = record.get("model_kwargs") or {}
    return resolve_data_info(
        get_model_config(record["model_name"]),
        fmnist=saved.get("dataset") == "fmnist" if fmnist is None else fmnist,
        img_size=img_size or kw.get("img_size") or saved.get("img_size"),
        mean=saved.get("mean"),
        std=saved.get("std"),
        crop_pct=crop_pct or saved.get("crop_pct"),
        interpolation=saved.get("interpolation"),
        eval_resize=eval_resize or saved.get("eval_resize"),
    )


def _load_into(net: nn.Module, source, where: str) -> None:
    try:
        load_checkpoint(net, source, strict=True)
    except ValueError as e:
        raise ValueError(f"checkpoint {where}: {e}") from None


def _refuse_unused_for_fmnist(img_size: int, **given) -> None:
    """Fashion-MNIST is evaluated from memory (no loader processes) and its 28 x 28 images are only
    normalised at input size 28 (no resize, no crop): the options that would do nothing."""
    unused = ["workers"] if given["workers"] is not None else []
    if img_size == 28:
        unused += [k for k in ("crop_pct", "eval_resize") if given[k] is not None]
    if unused:
        raise ValueError(
            f"{', '.join('--' + k.replace('_', '-') for k in unused)}: Fashion-MNIST is evaluated from memory at "
            f"input size {img_size} (no loader processes; 28 x 28 images are not resized or cropped)"
        )


def evaluate_checkpoint(
    checkpoint: PathLike,
    data: str,
    *,
    model: Optional[str] = None,
    ema: bool = False,
    batch_size: int = 256,
    split: Optional[str] = None,
    img_size: Optional[int] = None,
    crop_pct: Optional[float] = None,
    eval_resize: Optional[str] = None,
    device: str = "auto",
    amp: str = "none",
    workers: Optional[int] = None,
    json_path: Optional[PathLike] = None,
) -> dict:
    """Top-1/top-5 of a checkpoint on ``data`` ("fmnist", "fmnist:DIR" or an ImageNet-layout folder).

    Input size, normalisation and the eval resize follow the checkpoint's training config, else
    the dataset's, else the model's (``img_size`` / ``crop_pct`` / ``eval_resize`` override them).
    Unreadable images are skipped: ``n`` counts the images scored, ``n_unreadable`` the skipped ones.
    The result is also written to ``json_path`` when given and at least one image was scored.
    Non-finite logits (a checkpoint with NaN weights) raise a ValueError naming the checkpoint, and
    so does a model whose head predicts another number of classes than ``data`` holds.
    ``workers`` (loader processes for a folder, default 2) is refused for Fashion-MNIST, which is
    read from memory, and so are ``crop_pct`` / ``eval_resize`` when its 28 x 28 images are not resized.
    """
    dev = resolve_device(device, what="--device")
    net, record = load_trained_model(checkpoint, model=model, ema=ema)
    net.to(dev)
    name = record["model_name"]
    fmnist, _ = parse_source(data)
    info = trained_data_info(record, fmnist=fmnist, img_size=img_size, crop_pct=crop_pct, eval_resize=eval_resize)
    if fmnist:
        _refuse_unused_for_fmnist(info.img_size, workers=workers, crop_pct=crop_pct, eval_resize=eval_resize)
    dataset, _ = open_eval_source(data, info, split, what="--data")
    check_class_count(
        net.num_classes, dataset.num_classes, model=f"checkpoint {record['path']}: num_classes", data=f"--data {data}"
    )
    tf = EvalTransform(info.img_size, info.mean, info.std, info.crop_pct, info.interpolation, info.eval_resize).to(dev)
    batches = Batches(dataset, batch_size, train=False, workers=2 if workers is None else workers)
    t = time.time()
    res = evaluate(net, batches, tf, dev, DistInfo(device=dev), amp, source=f"checkpoint {checkpoint}")
    res.update(
        model=name,
        checkpoint=str(checkpoint),
        data=data,
        ema=ema,
        eval_time_s=round(time.time() - t, 2),
        img_s=round(res["n"] / max(time.time() - t, 1e-9), 1),
    )
    if json_path and res["n"]:
        from .._io import atomic_write_text

        atomic_write_text(json_path, json.dumps(res, indent=2))
    return res


@torch.no_grad()
def inference_throughput(
    model: nn.Module, input_size: tuple[int, int, int], batch_size: int = 256, iters: int = 10, warmup: int = 3
) -> float:
    """Median images/s of the forward pass on random inputs (eval mode, current threads)."""
    model.eval()
    p = next(model.parameters())
    x = torch.randn(batch_size, *input_size, device=p.device)
    for _ in range(warmup):
        model(x)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        model(x)
        if p.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    times.sort()
    return batch_size / times[len(times) // 2]
