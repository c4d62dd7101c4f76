"""``inline-attn seg train | eval | demo | info`` (registered into the main CLI)."""
from __future__ import annotations

import argparse
import json
import pathlib
import time

from .config import SEG_DEFAULTS, flat_keys, load_seg_config, parse_value

DEMO_CONFIG = "mosaic/demo.yaml"


def _configs_dir() -> pathlib.Path:
    from ..train.cli import configs_dir

    return configs_dir()


def _add_overrides(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("config overrides (YAML values: numbers, true/false, null, [lists])")
    for key, default in flat_keys():
        g.add_argument(f"--{key}", dest=f"ov:{key}", metavar="V", help=f"default: {default!r}")
    g.add_argument("--set", dest="ov_set", action="append", default=[], metavar="KEY=VALUE",
                   help="any dotted key, e.g. --set model.backbone_kwargs.pattern=SSSS (repeatable)")


def _overrides(args: argparse.Namespace) -> list:
    out = []
    for k, v in vars(args).items():
        if k.startswith("ov:") and v is not None:
            out.append((k[3:], parse_value(v)))
    for item in getattr(args, "ov_set", []):
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        out.append((k, parse_value(v)))
    return out


def _fmt(res: dict) -> str:
    return f"mIoU {res['mIoU']:.2f}  mAcc {res['mAcc']:.2f}  aAcc {res['aAcc']:.2f}"


def cmd_train(args) -> int:
    from .engine import train_seg

    ov = _overrides(args)
    if args.resume:
        ov.append(("train.resume", args.resume))
    if args.output:
        ov.append(("train.output", args.output))
    summary = train_seg(load_seg_config(args.config, ov))
    if summary.get("stopped") is None and "mIoU" in summary:
        print(f"done: {_fmt(summary)}  ({summary['iterations']} iterations, {summary['train_time_s'] / 60:.1f} min); "
              f"outputs in {summary['output']}")
    return 0


def cmd_eval(args) -> int:
    from ..train.distributed import cleanup, init_distributed
    from .data import build_seg_datasets
    from .engine import evaluate_seg, load_segmentor, save_predictions_png
    from .config import set_key

    info = init_distributed(args.device)
    try:
        model, cfg = load_segmentor(args.checkpoint, info.device)
        for k, v in _overrides(args):
            set_key(cfg, k, v)
        _, val = build_seg_datasets(cfg, train=False, progress=info.is_main)
        t0 = time.time()
        res = evaluate_seg(model, val, cfg, info.device, info, amp=args.amp, progress=info.is_main)
        if info.is_main:
            print(f"{cfg['model']['backbone']} + {cfg['model']['decode']}: {_fmt(res)}  ({len(val)} images, "
                  f"{cfg['eval']['mode']} inference, {time.time() - t0:.1f} s)")
            if args.per_class:
                for name, iou, acc in zip(res["classes"], res["IoU"], res["Acc"]):
                    print(f"  {name:24s} IoU {iou:6.2f}  Acc {acc:6.2f}")
            if args.json:
                pathlib.Path(args.json).write_text(json.dumps(res, indent=1))
            if args.png:
                print(f"predictions: {save_predictions_png(model, val, cfg, info.device, args.png)}")
    finally:
        cleanup(info)
    return 0


def cmd_demo(args) -> int:
    from .engine import train_seg

    cfg_path = pathlib.Path(args.config) if args.config else _configs_dir() / DEMO_CONFIG
    ov = [("train.output", args.output)] + _overrides(args)
    cfg = load_seg_config(cfg_path, ov)
    m = cfg["model"]
    print(f"seg demo: {m['backbone']} {m['backbone_kwargs']} + {m['decode']} on Fashion-MNIST mosaics "
          f"({cfg['sched']['iters']} iterations, config {cfg_path})", flush=True)
    t0 = time.time()
    s = train_seg(cfg)
    if s.get("stopped"):
        return 0
    print(f"\nseg demo finished in {(time.time() - t0) / 60:.1f} min: {_fmt(s)} on {cfg['data']['mosaic']['val']} "
          f"validation mosaics (garments from the Fashion-MNIST test split)")
    for name, iou in s["per_class_IoU"].items():
        print(f"  {name:12s} IoU {iou:6.2f}")
    print(f"  predictions: {s.get('predictions_png')}")
    print(f"  checkpoint:  {s['checkpoint']}")
    print(f"  evaluate again: inline-attn seg eval --checkpoint {s['checkpoint']}")
    return 0


def segmentor_info(config, overrides=(), *, num_classes=None, macs: bool = False) -> dict:
    """Parameter counts (backbone / neck / decode head / auxiliary head / total) of a config's
    segmentor, and its MACs at the crop size when ``macs``."""
    from ..models.profile import count_params, profile
    from .engine import build_from_config

    cfg = load_seg_config(config, overrides)
    n = num_classes or cfg["model"]["num_classes"] or (11 if cfg["data"]["dataset"] == "mosaic" else 150)
    model = build_from_config(dict(cfg, model=dict(cfg["model"], pretrained=None, checkpoint=None)), int(n))
    parts = {name: (count_params(getattr(model, name)) if getattr(model, name) is not None else 0)
             for name in ("backbone", "neck", "decode_head", "aux_head")}
    out = {"config": str(config), "backbone_name": cfg["model"]["backbone"], "decode": cfg["model"]["decode"],
           "num_classes": int(n), **parts, "params": count_params(model)}
    if macs:
        size = cfg["data"]["mosaic"]["size"] if cfg["data"]["dataset"] == "mosaic" else cfg["data"]["crop_size"]
        size = (size, size) if isinstance(size, int) else tuple(size)
        out["macs"] = profile(model, (3, *size)).macs
        out["macs_input"] = list(size)
    return out


def print_info(info: dict) -> None:
    print(f"{info['decode']} on {info['backbone_name']} ({info['num_classes']} classes; {info['config']})")
    for k in ("backbone", "neck", "decode_head", "aux_head", "params"):
        print(f"  {k:12s} {info[k]:>12,}")
    if "macs" in info:
        print(f"  MACs         {info['macs'] / 1e9:.3f} G at {info['macs_input'][0]}x{info['macs_input'][1]}")


def cmd_info(args) -> int:
    info = segmentor_info(args.config, _overrides(args), macs=args.macs)
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        print_info(info)
    return 0


def register(subparsers) -> None:
    seg = subparsers.add_parser("seg", help="semantic segmentation: train | eval | demo | info",
                                description="Semantic segmentation with InLine backbones (Semantic FPN, UperNet).")
    sub = seg.add_subparsers(dest="seg_command", metavar="SEG_COMMAND")
    sub.required = True

    p = sub.add_parser("train", allow_abbrev=False, help="train a segmentor from a YAML config",
                       description="Train with a YAML config (configs/ade20k/*.yaml, configs/mosaic/*.yaml); "
                                   "--section.key VALUE overrides any key. Under torchrun the same command "
                                   "trains on every process.")
    p.add_argument("-c", "--config", help="YAML config; defaults for every key not set")
    p.add_argument("--resume", help="'auto' (continue from OUTPUT/last.pth) or a checkpoint path")
    p.add_argument("--output", help="output folder (= --train.output)")
    _add_overrides(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", allow_abbrev=False, help="mIoU / mAcc / aAcc of a checkpoint",
                       description="Evaluate a checkpoint written by `seg train` on its config's validation "
                                   "split (override e.g. --data.path DIR, --eval.mode slide).")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--amp", default="none", choices=["none", "bf16", "fp16"])
    p.add_argument("--per-class", action="store_true", help="print each class's IoU and accuracy")
    p.add_argument("--json", help="also write the result to this JSON file")
    p.add_argument("--png", help="write a PNG of a few predictions beside the ground truth")
    _add_overrides(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("demo", allow_abbrev=False, help="train InLine-PVT + Semantic FPN on Fashion-MNIST mosaics",
                       description="Train a small InLine-PVT + Semantic FPN on Fashion-MNIST mosaics, print "
                                   "mIoU, write a PNG of predictions beside the ground truth.")
    p.add_argument("--output", default="runs/seg_demo")
    p.add_argument("--config", help=f"config (default configs/{DEMO_CONFIG})")
    _add_overrides(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("info", allow_abbrev=False, help="parameter counts (and MACs) of a config's segmentor")
    p.add_argument("-c", "--config", required=True)
    p.add_argument("--macs", action="store_true", help="also count MACs at the crop size (slow for big models)")
    p.add_argument("--json", action="store_true")
    _add_overrides(p)
    p.set_defaults(func=cmd_info)


__all__ = ["SEG_DEFAULTS", "register", "segmentor_info"]
