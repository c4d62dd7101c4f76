"""Evaluation of trained checkpoints, and rebuilding a trained model from its checkpoint."""
from __future__ import annotations

import os
import time
from typing import Optional, Union

import torch
import torch.nn as nn

from ..data import FMNIST_MEAN, FMNIST_STD, EvalTransform
from ..models import create_model, get_model_config
from . import checkpoint as ckpt_io
from .data import Batches, open_eval_source
from .distributed import DistInfo, resolve_device
from .engine import evaluate

PathLike = Union[str, os.PathLike]


def load_trained_model(checkpoint: PathLike, *, model: Optional[str] = None, ema: bool = False,
                       map_location="cpu", **overrides) -> tuple[nn.Module, dict]:
    """Rebuild the model a checkpoint was trained with and load its weights (eval mode).

    Our checkpoints record ``model_name`` and ``model_kwargs`` (the constructor overrides, e.g.
    a 28 x 28 one-channel DeiT for Fashion-MNIST); ``model`` / ``overrides`` replace them. A
    foreign checkpoint (``{"model": ...}``, ``{"state_dict": ...}`` or a bare state dict) needs
    ``model``. Loading is strict. Returns ``(model, checkpoint dict)``.
    """
    from ..models.checkpoint import load_checkpoint

    if str(checkpoint).endswith(".safetensors"):  # weights only (save_checkpoint's format)
        if model is None:
            raise ValueError(f"{checkpoint} holds weights only: pass --model NAME")
        net = create_model(model, **overrides)
        load_checkpoint(net, checkpoint, strict=True)
        return net.eval(), {}
    ckpt = ckpt_io.load(checkpoint, map_location=map_location)
    name = model or ckpt.get("model_name")
    if name is None:
        raise ValueError(f"checkpoint {checkpoint} does not record its model: pass --model NAME")
    kwargs = dict(ckpt.get("model_kwargs") or {}) if name == ckpt.get("model_name") else {}
    kwargs.update(overrides)
    net = create_model(name, **kwargs)
    # the family's key filter maps the authors' checkpoints; a mismatch is a ValueError naming the keys
    load_checkpoint(net, ckpt_io.model_state_dict(ckpt, ema=ema), strict=True)
    return net.eval(), ckpt


def evaluate_checkpoint(checkpoint: PathLike, data: str, *, model: Optional[str] = None, ema: bool = False,
                        batch_size: int = 256, split: Optional[str] = None, img_size: Optional[int] = None,
                        crop_pct: Optional[float] = None, device: str = "auto", amp: str = "none",
                        workers: int = 2) -> dict:
    """Top-1/top-5 of a checkpoint on ``data`` ("fmnist" or an ImageNet-layout folder)."""
    dev = resolve_device(device)
    net, ckpt = load_trained_model(checkpoint, model=model, ema=ema)
    net.to(dev)
    name = model or ckpt.get("model_name")
    mcfg = get_model_config(name)
    kw = ckpt.get("model_kwargs") or {}
    fmnist = data == "fmnist" or data.startswith("fmnist:")
    size = img_size or kw.get("img_size") or (28 if fmnist else mcfg.input_size[-1])
    cp = crop_pct or (1.0 if fmnist else mcfg.crop_pct)
    dataset, fmnist = open_eval_source(data, size, cp, mcfg.interpolation, split)
    mean, std = (FMNIST_MEAN, FMNIST_STD) if fmnist else (mcfg.mean, mcfg.std)
    cfg_data = (ckpt.get("config") or {}).get("data", {})
    mean, std = tuple(cfg_data.get("mean") or mean), tuple(cfg_data.get("std") or std)
    tf = EvalTransform(size, mean, std, cp, mcfg.interpolation).to(dev)
    batches = Batches(dataset, batch_size, train=False, workers=workers)
    t = time.time()
    res = evaluate(net, batches, tf, dev, DistInfo(device=dev), amp)
    res.update(model=name, checkpoint=str(checkpoint), data=data, ema=ema, eval_time_s=round(time.time() - t, 2),
               img_s=round(res["n"] / max(time.time() - t, 1e-9), 1))
    return res


@torch.no_grad()
def inference_throughput(model: nn.Module, input_size: tuple[int, int, int], batch_size: int = 256,
                         iters: int = 10, warmup: int = 3) -> float:
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
