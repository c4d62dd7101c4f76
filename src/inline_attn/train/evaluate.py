"""Evaluation of trained checkpoints, and rebuilding a trained model from its checkpoint."""

from __future__ import annotations

import os
import time
from typing import Optional, Union

import torch
import torch.nn as nn

from ..data import EvalTransform, open_eval_source, parse_source, resolve_data_info
from ..models import create_model, get_model_config
from ..models.checkpoint import load_checkpoint, read_checkpoint, unwrap_state_dict
from .data import Batches
from .distributed import DistInfo, resolve_device
from .loop import evaluate

PathLike = Union[str, os.PathLike]


def load_trained_model(
    checkpoint: PathLike, *, model: Optional[str] = None, ema: bool = False, **overrides
) -> tuple[nn.Module, dict]:
    """Rebuild the model a checkpoint was trained with and load its weights (eval mode).

    Our checkpoints record ``model_name`` and ``model_kwargs`` (the constructor overrides, e.g.
    a 28 x 28 one-channel DeiT for Fashion-MNIST); ``model`` / ``overrides`` replace them. A
    foreign checkpoint (``{"model": ...}``, ``{"state_dict": ...}`` or a bare state dict) needs
    ``model``. Loading is strict. Returns ``(model, checkpoint dict)``; errors name the file.
    """
    where = repr(str(checkpoint))
    if str(checkpoint).endswith(".safetensors"):  # weights only (save_checkpoint's format)
        if model is None:
            raise ValueError(f"{checkpoint} holds weights only: pass --model NAME")
        net = create_model(model, **overrides)
        _load_into(net, checkpoint, where)
        return net.eval(), {}
    ckpt = read_checkpoint(checkpoint, weights_only=False)  # a file the user names; ours hold configs
    recorded = ckpt.get("model_name") if isinstance(ckpt, dict) else None
    name = model or recorded
    if name is None:
        raise ValueError(f"checkpoint {checkpoint} does not record its model: pass --model NAME")
    kwargs = dict(ckpt.get("model_kwargs") or {}) if name == recorded else {}
    kwargs.update(overrides)
    net = create_model(name, **kwargs)
    # the family's key filter maps the authors' checkpoints; a mismatch is a ValueError naming the keys
    _load_into(net, unwrap_state_dict(ckpt, ema=ema, where=where), where)
    return net.eval(), (ckpt if isinstance(ckpt, dict) else {})


def _load_into(net: nn.Module, source, where: str) -> None:
    try:
        load_checkpoint(net, source, strict=True)
    except ValueError as e:
        raise ValueError(f"checkpoint {where}: {e}") from None


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
    workers: int = 2,
) -> dict:
    """Top-1/top-5 of a checkpoint on ``data`` ("fmnist", "fmnist:DIR" or an ImageNet-layout folder).

    Input size, normalisation and the eval resize follow the checkpoint's training config, else
    the dataset's, else the model's (``img_size`` / ``crop_pct`` / ``eval_resize`` override them).
    Unreadable images are skipped: ``n`` counts the images scored, ``n_unreadable`` the skipped ones.
    """
    dev = resolve_device(device, what="--device")
    net, ckpt = load_trained_model(checkpoint, model=model, ema=ema)
    net.to(dev)
    name = model or ckpt.get("model_name")
    mcfg = get_model_config(name)
    kw = ckpt.get("model_kwargs") or {}
    saved = (ckpt.get("config") or {}).get("data") or {}
    fmnist, _ = parse_source(data)
    info = resolve_data_info(
        mcfg,
        fmnist=fmnist,
        img_size=img_size or kw.get("img_size") or saved.get("img_size"),
        mean=saved.get("mean"),
        std=saved.get("std"),
        crop_pct=crop_pct or saved.get("crop_pct"),
        interpolation=saved.get("interpolation"),
        eval_resize=eval_resize or saved.get("eval_resize"),
    )
    dataset, _ = open_eval_source(data, info, split, what="--data")
    tf = EvalTransform(info.img_size, info.mean, info.std, info.crop_pct, info.interpolation, info.eval_resize).to(dev)
    batches = Batches(dataset, batch_size, train=False, workers=workers)
    t = time.time()
    res = evaluate(net, batches, tf, dev, DistInfo(device=dev), amp)
    res.update(
        model=name,
        checkpoint=str(checkpoint),
        data=data,
        ema=ema,
        eval_time_s=round(time.time() - t, 2),
        img_s=round(res["n"] / max(time.time() - t, 1e-9), 1),
    )
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
