"""``inline-attn seg train | eval | demo | compare | mosaics | info`` and ``inline-attn det train |
eval | demo | compare`` (registered into the main CLI).

Each command calls the task's library function: ``SegTask`` / ``DetTask`` (:mod:`inline_attn.dense.seg_task`,
:mod:`inline_attn.dense.det_task`) train, and each task module's ``evaluate_checkpoint`` evaluates.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from dataclasses import dataclass
from typing import Callable

from .._io import writable_dir, writable_file
from ..runtime.config import add_override_options, collect_overrides, run_options
from ..runtime.signals import exit_code
from ..dense.config import DetConfig, SegConfig
from ..runtime.output import OVERWRITE_HELP, demo_output


def _configs_dir() -> pathlib.Path:
    from ..train.config import configs_dir

    return configs_dir()


# the settings evaluation and model info read (the others are training's; --set still reaches any key,
# and the task names what it does not read)
EVAL_SECTIONS = ("data", "eval", "train.threads")
INFO_SECTIONS = ("model", "data.crop_size")


def _add_overrides(p: argparse.ArgumentParser, config: type = SegConfig, sections=None) -> None:
    add_override_options(p, config, "model.backbone_kwargs.pattern=SSSS", sections)


def _overrides(args: argparse.Namespace) -> list:
    return collect_overrides(args, ("model.backbone_kwargs",))


@dataclass(frozen=True)
class DenseCommand:
    """What differs between ``seg`` and ``det`` on the command line; train / demo / compare and their
    arguments are written once against it."""

    name: str  # the subcommand: "seg" or "det" (its task class: task_classes()[name])
    config: type  # the typed config (its settings are the --section.key overrides)
    demo_config: str  # relative to configs/
    demo_title: str  # "InLine-PVT + Semantic FPN" / "FCOS on InLine-PVT"
    demo_line: Callable  # config -> "seg demo: ..." header line
    demo_metric_note: str  # after the validation-set size in the demo's result line
    demo_extras: Callable  # summary -> extra lines of the demo's result

    def task(self):
        return task_classes()[self.name]()


def task_classes() -> dict:
    """The task class of each subcommand, imported on first use (building the parser, ``--help``
    included, needs only the configs)."""
    from ..dense.det_task import DetTask
    from ..dense.seg_task import SegTask

    return {"seg": SegTask, "det": DetTask}


SEG = DenseCommand(
    name="seg",
    config=SegConfig,
    demo_config="mosaic/demo.yaml",
    demo_title="InLine-PVT + Semantic FPN",
    demo_line=lambda m: f"seg demo: {m.backbone} {m.backbone_kwargs} + {m.decode}",
    demo_metric_note="garments from the Fashion-MNIST test split",
    demo_extras=lambda s: (
        [f"  {name:12s} IoU {iou:6.2f}" for name, iou in s["per_class_IoU"].items()]
        + [f"  predictions: {s.get('predictions_png')}"]
    ),
)
DET = DenseCommand(
    name="det",
    config=DetConfig,
    demo_config="mosaic/det_demo.yaml",
    demo_title="FCOS on InLine-PVT",
    demo_line=lambda m: f"det demo: FCOS on {m.backbone} {m.backbone_kwargs}",
    demo_metric_note="garments from the Fashion-MNIST test split; COCO box AP by pycocotools",
    demo_extras=lambda s: [f"  detections:  {s.get('detections_png')}"],
)
TASKS = {t.name: t for t in (SEG, DET)}


def cmd_train(args) -> int:
    command = TASKS[args.task]
    task = command.task()
    ov = _overrides(args)
    if args.output:
        ov.append(("train.output", writable_dir(args.output, "--output")))
    ov += run_options(args)
    from ..runtime.run import train

    summary = train(task, task.config.load(args.config, ov))
    if summary.get("stopped") is None and task.metric_keys[0] in summary:
        print(
            f"done: {task.result_line(summary)}  ({summary['steps']} iterations, "
            f"{summary['train_time_s'] / 60:.1f} min); outputs in {summary['output']}"
        )
    return exit_code(summary.get("signal"))


def cmd_demo(args) -> int:
    command = TASKS[args.task]
    task = command.task()
    cfg_path = pathlib.Path(args.config) if args.config else _configs_dir() / command.demo_config
    output = demo_output(args.output, f"runs/{args.task}_demo", continuing=args.resume or args.overwrite)
    ov = [("train.output", writable_dir(output, "--output"))] + _overrides(args) + run_options(args)
    cfg = task.config.load(cfg_path, ov)
    print(
        f"{command.demo_line(cfg.model)} on Fashion-MNIST mosaics ({cfg.sched.iters} iterations, config {cfg_path})",
        flush=True,
    )
    from ..runtime.run import train

    t0 = time.time()
    s = train(task, cfg)
    if s.get("stopped"):
        return exit_code(s.get("signal"))
    print(
        f"\n{command.name} demo finished in {(time.time() - t0) / 60:.1f} min: {task.result_line(s)} on "
        f"{cfg.data.mosaic.val} validation mosaics ({command.demo_metric_note})"
    )
    for line in command.demo_extras(s):
        print(line)
    print(f"  checkpoint:  {s['checkpoint']}")
    print(f"  evaluate again: inline-attn {command.name} eval --checkpoint {s['checkpoint']}")
    return 0


def cmd_compare(args) -> int:
    import shlex
    import sys

    from ..experiments.dense_compare import run

    task = TASKS[args.task]
    cfg_path = args.config or str(_configs_dir() / task.demo_config)
    command = (
        "inline-attn " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        if sys.argv[1:2] == [task.name]
        else f"inline-attn {task.name} compare --seeds {' '.join(map(str, args.seeds))} "
        f"--patterns {' '.join(args.patterns)}"
    )
    print(
        run(
            cfg_path,
            patterns=args.patterns,
            seeds=args.seeds,
            output=writable_dir(args.output, "--output"),
            command=command,
            overrides=_overrides(args),
            task=task.name,
        )
    )
    return 0


def cmd_eval(args) -> int:
    from ..dense.seg_task import SegTask, evaluate_checkpoint

    _check_output_files(args)
    res = evaluate_checkpoint(
        args.checkpoint, overrides=_overrides(args), device=args.device, amp=args.amp, json_path=args.json, png=args.png
    )
    if res["rank"] == 0:
        print(
            f"{res['backbone']} + {res['decode']}: {SegTask().result_line(res)}  ({res['images']} images, "
            f"{res['mode']} inference, {res['eval_time_s']:.1f} s)"
        )
        if args.per_class:
            for name, iou, acc in zip(res["classes"], res["IoU"], res["Acc"]):
                print(f"  {name:24s} IoU {iou:6.2f}  Acc {acc:6.2f}")
        if args.png:
            print(f"predictions: {res['predictions_png']}")
    return 0


def cmd_det_eval(args) -> int:
    from ..dense.det_task import DetTask, evaluate_checkpoint

    _check_output_files(args)
    res = evaluate_checkpoint(
        args.checkpoint, overrides=_overrides(args), device=args.device, amp=args.amp, json_path=args.json, png=args.png
    )
    print(
        f"FCOS on {res['backbone']}: {DetTask().result_line(res)}  APs {res['APs']:.2f}  APm {res['APm']:.2f}  "
        f"APl {res['APl']:.2f}  ({res['images']} images, {res['eval_time_s']:.1f} s)"
    )
    if args.png:
        print(f"detections: {res['detections_png']}")
    return 0


def _check_output_files(args) -> None:
    """--json / --png checked before the work: their folders created and writable."""
    for flag in ("json", "png"):
        if getattr(args, flag, None):
            writable_file(getattr(args, flag), f"--{flag}")


def cmd_mosaics(args) -> int:
    from ..dense.viz import export_mosaics
    from ..dense.data.mosaic import FashionMosaics, MosaicSpec

    _check_output_files(args)
    if args.coco:
        writable_dir(args.coco, "--coco")

    spec = MosaicSpec(
        size=args.size, objects=tuple(args.objects), scale=tuple(args.scale), max_overlap=args.max_overlap
    )
    mosaics = FashionMosaics(args.split, args.num, spec, seed=args.seed, root=args.fmnist)
    written = export_mosaics(mosaics, coco=args.coco, png=args.png, rows=args.rows)
    if "coco" in written:
        print(f"COCO instances: {written['coco']} ({args.num} mosaics; images in {pathlib.Path(args.coco) / 'images'})")
    if "png" in written:
        print(f"samples: {written['png']}")
    return 0


def cmd_info(args) -> int:
    from ..dense.seg_task import format_segmentor_info, segmentor_info

    info = segmentor_info(args.config, _overrides(args), macs=args.macs)
    print(json.dumps(info, indent=1) if args.json else format_segmentor_info(info))
    return 0


def register(subparsers) -> None:
    register_seg(subparsers)
    register_det(subparsers)


def _task_parsers(subparsers, task: DenseCommand, *, help: str, description: str, train_help: str, train_desc: str):
    """The ``task`` command with its train, demo and compare subcommands; returns the subparsers
    (for eval and the task's own commands)."""
    top = subparsers.add_parser(task.name, help=help, description=description)
    sub = top.add_subparsers(dest=f"{task.name}_command", metavar=f"{task.name.upper()}_COMMAND")
    sub.required = True

    p = sub.add_parser("train", allow_abbrev=False, help=train_help, description=train_desc)
    p.add_argument("-c", "--config", help="YAML config; defaults for every key not set")
    p.add_argument("--resume", help="'auto' (continue from OUTPUT/last.pth) or a checkpoint path")
    p.add_argument("--output", help="output folder (= --train.output)")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP + " (= --train.overwrite true)")
    _add_overrides(p, task.config)
    p.set_defaults(func=cmd_train, task=task.name)
    return sub


def _demo_and_compare(sub, task: DenseCommand, *, demo_desc: str, metric_name: str) -> None:
    p = sub.add_parser(
        "demo",
        allow_abbrev=False,
        help=f"train {task.demo_title} on Fashion-MNIST mosaics",
        description=demo_desc,
    )
    p.add_argument("--output", help=f"output folder (default runs/{task.name}_demo, or -2, ... beside earlier ones)")
    p.add_argument("--config", help=f"config (default configs/{task.demo_config})")
    p.add_argument("--resume", help="'auto' to continue an interrupted demo")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    _add_overrides(p, task.config)
    p.set_defaults(func=cmd_demo, task=task.name)

    p = sub.add_parser(
        "compare",
        allow_abbrev=False,
        help=f"InLine vs softmax backbone, several seeds, {metric_name} mean +- std",
        description=f"Train the {task.name} demo recipe (or --config) with each backbone attention pattern "
        f"and seed; write {metric_name} mean +- std into OUTPUT/report.md (finished runs are reused, "
        "unfinished ones resumed).",
    )
    p.add_argument("--config", help=f"config (default configs/{task.demo_config})")
    p.add_argument("--patterns", nargs="+", default=["IIII", "SSSS"], help="PVT attention patterns (I, S, L per stage)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--output", default=f"runs/{task.name}_compare")
    _add_overrides(p, task.config)
    p.set_defaults(func=cmd_compare, task=task.name)


def _eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--amp", default="none", choices=["none", "bf16", "fp16"])
    p.add_argument("--json", help="also write the result to this JSON file")


def register_seg(subparsers) -> None:
    sub = _task_parsers(
        subparsers,
        SEG,
        help="semantic segmentation: train | eval | demo | compare | mosaics | info",
        description="Semantic segmentation with InLine backbones (Semantic FPN, UperNet).",
        train_help="train a segmentor from a YAML config",
        train_desc="Train with a YAML config (configs/ade20k/*.yaml, configs/mosaic/*.yaml); "
        "--section.key VALUE overrides any key. Under torchrun the same command "
        "trains on every process.",
    )
    p = sub.add_parser(
        "eval",
        allow_abbrev=False,
        help="mIoU / mAcc / aAcc of a checkpoint",
        description="Evaluate a checkpoint written by `seg train` on its config's validation "
        "split (override e.g. --data.path DIR, --eval.mode slide).",
    )
    _eval_args(p)
    p.add_argument("--per-class", action="store_true", help="print each class's IoU and accuracy")
    p.add_argument("--png", help="write a PNG of a few predictions beside the ground truth")
    _add_overrides(p, sections=EVAL_SECTIONS)
    p.set_defaults(func=cmd_eval)

    _demo_and_compare(
        sub,
        SEG,
        demo_desc="Train a small InLine-PVT + Semantic FPN on Fashion-MNIST mosaics, print "
        "mIoU, write a PNG of predictions beside the ground truth.",
        metric_name="mIoU / mAcc / aAcc",
    )

    p = sub.add_parser(
        "mosaics",
        allow_abbrev=False,
        help="export Fashion-MNIST mosaics (COCO JSON, sample PNG)",
        description="Build deterministic Fashion-MNIST mosaics and write them as a COCO-format "
        "folder (images, semantic label PNGs, instances JSON) and/or a PNG of samples.",
    )
    p.add_argument("--split", default="val", choices=["train", "val"], help="val: garments of the test split only")
    p.add_argument("--num", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--objects", type=int, nargs=2, default=[2, 3])
    p.add_argument("--scale", type=float, nargs=2, default=[1.0, 1.0])
    p.add_argument("--max-overlap", type=float, default=0.15)
    p.add_argument("--fmnist", help="Fashion-MNIST folder (default: $INLINE_ATTN_FMNIST or Debian's)")
    p.add_argument("--coco", metavar="DIR", help="write DIR/images, DIR/labels, DIR/annotations/instances_<split>.json")
    p.add_argument("--png", metavar="FILE", help="write a PNG of the first --rows mosaics")
    p.add_argument("--rows", type=int, default=None, help="--png: how many mosaics it shows (default 4)")
    p.set_defaults(func=cmd_mosaics)

    p = sub.add_parser("info", allow_abbrev=False, help="parameter counts (and MACs) of a config's segmentor")
    p.add_argument("-c", "--config", required=True)
    p.add_argument("--macs", action="store_true", help="also count MACs at the crop size (slow for big models)")
    p.add_argument("--json", action="store_true")
    _add_overrides(p, sections=INFO_SECTIONS)
    p.set_defaults(func=cmd_info)


def register_det(subparsers) -> None:
    sub = _task_parsers(
        subparsers,
        DET,
        help="object detection (FCOS): train | eval | demo | compare",
        description="Object detection with InLine backbones: a one-stage FCOS detector, COCO box AP.",
        train_help="train a detector from a YAML config",
        train_desc="Train FCOS with a YAML config (configs/mosaic/det_demo.yaml; data.dataset coco with "
        "data.coco.* for a COCO folder); --section.key VALUE overrides any key.",
    )
    p = sub.add_parser(
        "eval",
        allow_abbrev=False,
        help="COCO box AP of a checkpoint",
        description="Evaluate a checkpoint written by `det train` on its config's validation set "
        "(e.g. --data.dataset coco --data.coco.val_ann FILE --data.coco.val_images DIR).",
    )
    _eval_args(p)
    p.add_argument("--png", help="write a PNG of a few images: ground truth beside the detections")
    _add_overrides(p, DetConfig, EVAL_SECTIONS)
    p.set_defaults(func=cmd_det_eval)

    _demo_and_compare(
        sub,
        DET,
        demo_desc="Train a small FCOS on InLine-PVT on Fashion-MNIST mosaics, print COCO box AP, "
        "write a PNG of detections beside the ground truth.",
        metric_name="box AP",
    )


__all__ = ["register", "register_det"]
