"""Measurements on the ablations' runs beside training: masking (part e) on the trained models and
inference speed (parts d, f) of every setting, each cached as a JSON in ``OUTPUT/results/``."""

from __future__ import annotations

import os
import pathlib
from typing import Callable, Optional

import torch

from ..._io import read_json
from ...runtime.report import write_json
from ...train.config import Config
from .settings import Budget, Setting, part_settings, unique


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages, rounded: logged beside every run (a shared machine)."""
    return [round(x, 2) for x in os.getloadavg()]


def mask_one(setting: Setting, seed: int, budget: Budget, output: pathlib.Path) -> dict:
    """Part e on one trained run: top-1 unmasked, local k x k masked, as many random keys masked."""
    from ...analysis.common import ImageBatches, load_images, load_model
    from ...analysis.masking import masked_accuracy

    lm = load_model(None, output / setting.key / f"seed{seed}")
    images = load_images("fmnist", num_images=budget.mask_images, setting="Budget.mask_images")
    rows = masked_accuracy(lm.model, ImageBatches(images, lm, 50), ks=(3, 5, 7), seed=seed, progress=False)
    return {"setting": setting.key, "kind": setting.kind, "seed": seed, "rows": rows, "load": load_average()}


def bench_one(setting: Setting, budget: Budget, config_dir: pathlib.Path) -> dict:
    """Inference img/s of the setting's model (random weights: speed does not depend on them), one thread."""
    from ...models import create_model
    from ...train.evaluate import inference_throughput

    cfg = Config.load(config_dir / setting.config, list(setting.overrides))
    img = cfg.data.img_size or 28
    model = create_model(cfg.model.name, num_classes=10, in_chans=1, **{"img_size": img, **cfg.model.kwargs})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ips = inference_throughput(model, (1, img, img), batch_size=budget.bench_batch, iters=budget.bench_iters)
    finally:
        torch.set_num_threads(threads)
    return {"setting": setting.key, "infer_img_s": round(ips, 1), "load": load_average()}


def _cached(path: pathlib.Path, make: Callable[[], Optional[dict]]) -> tuple[Optional[dict], bool]:
    """(record, made_now): the JSON at ``path`` if it exists, else ``make()`` written atomically."""
    if path.is_file():
        return read_json(path), False
    rec = make()
    if rec is not None:
        write_json(rec, path)
    return rec, True


def measure_runs(parts, results, budget, out, cdir, seeds, progress) -> dict:
    """Masking (part e) on finished runs (cached, one JSON per run) and inference speed (parts d, f)."""
    from tqdm import tqdm

    res_dir = out / "results"
    extras: dict = {"mask": {}, "bench": {}}
    if "e" in parts:
        for s in part_settings("e"):
            for seed in range(seeds):
                if any(r["seed"] == seed and r["top1"] is not None for r in results.get(s.key, [])):
                    rec, _ = _cached(
                        res_dir / f"mask__{s.key}__seed{seed}.json", lambda: mask_one(s, seed, budget, out)
                    )
                    extras["mask"].setdefault(s.key, []).append(rec)
    if "d" in parts or "f" in parts:
        wanted = unique(s for p in parts if p in "abcdf" for s in part_settings(p))
        wanted = [s for s in wanted if s.key in results]
        # measured again by every invocation, all settings one after another, so the speeds compared
        # in one table come from one pass under one load
        for s in tqdm(wanted, desc="inference img/s", disable=not progress):
            extras["bench"][s.key] = bench_one(s, budget, cdir)
        write_json(extras["bench"], res_dir / "bench.json")
    return extras
