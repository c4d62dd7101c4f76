"""``inline-attn train | eval | demo | reproduce`` (registered into the main CLI)."""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

from .config import DEFAULTS, _FREEFORM, load_config, parse_value

DEMO_CONFIG = "fmnist/demo.yaml"
FMNIST_VARIANTS = ("softmax", "linear", "inline_nolr", "inline")


def configs_dir() -> pathlib.Path:
    """The project's ``configs/``: $INLINE_ATTN_CONFIGS, ./configs, or the one beside the source tree."""
    cands = [os.environ.get("INLINE_ATTN_CONFIGS"), "configs", pathlib.Path(__file__).resolve().parents[3] / "configs"]
    for c in cands:
        if c and (pathlib.Path(c) / DEMO_CONFIG).is_file():
            return pathlib.Path(c)
    raise ValueError("cannot find the configs/ folder (run from the repository root or set INLINE_ATTN_CONFIGS)")


def _add_override_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("config overrides (YAML values: numbers, true/false, null, [lists])")
    for section, keys in DEFAULTS.items():
        for key in keys:
            dest = f"{section}.{key}"
            if (section, key) in _FREEFORM:
                g.add_argument(f"--{dest}", dest=f"ov:{dest}", metavar="MAPPING",
                               help="model constructor overrides as a YAML mapping, e.g. '{depth: 4}'")
            else:
                g.add_argument(f"--{dest}", dest=f"ov:{dest}", metavar="V", help=f"default: {keys[key]!r}")
    g.add_argument("--set", dest="ov_set", action="append", default=[], metavar="KEY=VALUE",
                   help="any dotted key, e.g. --set model.kwargs.embed_dim=64 (repeatable)")


def collect_overrides(args: argparse.Namespace) -> list:
    out = []
    for k, v in vars(args).items():
        if k.startswith("ov:") and v is not None:
            val = parse_value(v)
            if k == "ov:model.kwargs" and not isinstance(val, dict):
                raise ValueError(f"--model.kwargs expects a YAML mapping, got {v!r}")
            out.append((k[3:], val))
    for item in args.ov_set:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        out.append((k, parse_value(v)))
    return out


def cmd_train(args) -> int:
    from .engine import train

    overrides = collect_overrides(args)
    if args.resume:
        overrides.append(("train.resume", args.resume))
    if args.output:
        overrides.append(("train.output", args.output))
    cfg = load_config(args.config, overrides)
    summary = train(cfg)
    if summary.get("rank", 0) == 0 and summary.get("interrupted") is None and summary.get("final"):
        f = summary["final"]
        print(f"done: top-1 {f['val_top1']:.2f}%  top-5 {f['val_top5']:.2f}%  outputs in {summary['output']}")
    return 0


def cmd_eval(args) -> int:
    from .evaluate import evaluate_checkpoint

    res = evaluate_checkpoint(args.checkpoint, args.data, model=args.model, ema=args.ema, batch_size=args.batch_size,
                              split=args.split, img_size=args.img_size, crop_pct=args.crop_pct, device=args.device,
                              amp=args.amp, workers=args.workers)
    print(f"{res['model']}: top-1 {res['top1']:.2f}%  top-5 {res['top5']:.2f}%  loss {res['loss']:.4f}  "
          f"({res['n']} images, {res['img_s']:.0f} img/s)")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


def cmd_demo(args) -> int:
    from .engine import train
    from .evaluate import evaluate_checkpoint

    cfg_path = pathlib.Path(args.config) if args.config else configs_dir() / DEMO_CONFIG
    overrides = [("train.output", args.output)]
    if args.epochs:
        overrides.append(("sched.epochs", args.epochs))
    cfg = load_config(cfg_path, overrides)
    t0 = time.time()
    print(f"demo: training {cfg['model']['name']} {cfg['model']['kwargs']} on Fashion-MNIST "
          f"({cfg['sched']['epochs'] + cfg['sched']['cooldown_epochs']} epochs, config {cfg_path})", flush=True)
    summary = train(cfg)
    if summary.get("interrupted"):
        return 0
    out = pathlib.Path(summary["output"])
    if cfg["train"]["threads"]:  # evaluate with the threads the model trained with
        import torch

        torch.set_num_threads(int(cfg["train"]["threads"]))
    res = evaluate_checkpoint(out / "last.pth", "fmnist:" + (cfg["data"]["path"] or "") if cfg["data"]["path"]
                              else "fmnist", batch_size=512)
    total = time.time() - t0
    print(f"\ndemo finished in {total / 60:.1f} min: test top-1 {res['top1']:.2f}%  top-5 {res['top5']:.2f}% "
          f"({res['n']} Fashion-MNIST test images)")
    print(f"  checkpoint: {summary['checkpoint']}")
    print(f"  curves:     {out / 'curves.png'}")
    print(f"  summary:    {out / 'summary.json'}")
    print(f"  metrics:    {out / 'metrics.csv'}")
    print(f"  evaluate again: inline-attn eval --checkpoint {summary['checkpoint']} --data fmnist")
    return 0


def cmd_reproduce(args) -> int:
    from .reproduce import reproduce_fmnist

    if args.target != "fmnist":
        raise ValueError(f"unknown reproduction target {args.target!r}: expected 'fmnist'")
    reproduce_fmnist(output=args.output, epochs=args.epochs, doc=args.doc, variants=args.variants,
                     config_dir=args.configs)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("train", allow_abbrev=False, help="train a model from a YAML config",
                              description="Train with a YAML config; --section.key VALUE overrides any key. "
                                          "Under torchrun the same command trains on every process.")
    p.add_argument("-c", "--config", help="YAML config (configs/...); defaults for every key not set")
    p.add_argument("--resume", help="'auto' (continue from OUTPUT/last.pth) or a checkpoint path")
    p.add_argument("--output", help="output folder (= --train.output)")
    _add_override_options(p)
    p.set_defaults(func=cmd_train)

    p = subparsers.add_parser("eval", allow_abbrev=False, help="top-1/top-5 of a checkpoint",
                              description="Evaluate a checkpoint on an ImageNet-layout folder (its val/ split "
                                          "if present) or on Fashion-MNIST ('fmnist' or 'fmnist:DIR').")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--model", help="model name (default: the one recorded in the checkpoint)")
    p.add_argument("--data", required=True, help="DIR (ImageNet layout) | fmnist | fmnist:DIR")
    p.add_argument("--split", help="subfolder of DIR (default val) or the Fashion-MNIST split (default test)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--img-size", type=int)
    p.add_argument("--crop-pct", type=float)
    p.add_argument("--ema", action="store_true", help="evaluate the EMA weights")
    p.add_argument("--device", default="auto")
    p.add_argument("--amp", default="none", choices=["none", "bf16", "fp16"])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", help="also write the result to this JSON file")
    p.set_defaults(func=cmd_eval)

    p = subparsers.add_parser("demo", help="train the default InLine model on Fashion-MNIST and evaluate it")
    p.add_argument("--output", default="runs/demo")
    p.add_argument("--epochs", type=int, help="override the config's epochs")
    p.add_argument("--config", help=f"config (default configs/{DEMO_CONFIG})")
    p.set_defaults(func=cmd_demo)

    p = subparsers.add_parser("reproduce", help="train the four Fashion-MNIST variants and tabulate them")
    p.add_argument("target", choices=["fmnist"])
    p.add_argument("--output", default="runs/fmnist", help="one subfolder per variant")
    p.add_argument("--epochs", type=int, help="the same epoch budget for every variant (default: the configs')")
    p.add_argument("--doc", default="docs/reproduction.md", help="markdown file to write the table into")
    p.add_argument("--variants", nargs="+", default=list(FMNIST_VARIANTS), choices=list(FMNIST_VARIANTS))
    p.add_argument("--configs", help="configs folder (default: found automatically)")
    p.set_defaults(func=cmd_reproduce)
