"""``inline-attn train | eval | demo | reproduce`` (registered into the main CLI)."""

from __future__ import annotations

import argparse
import pathlib
import time

from .._io import writable_file
from ..runtime.config import add_override_options, collect_overrides as _collect, run_options
from ..runtime.signals import exit_code
from ..runtime.output import OVERWRITE_HELP, demo_output
from ..train.config import DEMO_CONFIG, FMNIST_VARIANTS, FREEFORM, Config, configs_dir


def _add_override_options(p: argparse.ArgumentParser) -> None:
    add_override_options(p, Config, "model.kwargs.embed_dim=64")


def collect_overrides(args: argparse.Namespace) -> list:
    return _collect(args, FREEFORM)


def cmd_train(args) -> int:
    from ..train.task import train

    overrides = collect_overrides(args) + run_options(args)
    if args.output:
        overrides.append(("train.output", args.output))
    cfg = Config.load(args.config, overrides)
    summary = train(cfg)
    if summary.get("rank", 0) == 0 and summary.get("stopped") is None and summary.get("final"):
        f = summary["final"]
        best = ""
        if summary.get("best_val_top1") is not None:
            best = f"  (best {summary['best_val_top1']:.2f}% at epoch {summary['best_epoch']}"
            if summary.get("best_val_top1_ema") is not None:
                best += f"; EMA best {summary['best_val_top1_ema']:.2f}% at epoch {summary['best_ema_epoch']}"
            best += ")"
        print(f"done: top-1 {f['val_top1']:.2f}%  top-5 {f['val_top5']:.2f}%{best}  outputs in {summary['output']}")
    return exit_code(summary.get("signal"))


def _eval_line(res: dict) -> str:
    skipped = f", {res['n_unreadable']} unreadable skipped" if res.get("n_unreadable") else ""
    return (
        f"{res['model']}: top-1 {res['top1']:.2f}%  top-5 {res['top5']:.2f}%  loss {res['loss']:.4f}  "
        f"({res['n']} images scored{skipped}, {res['img_s']:.0f} img/s)"
    )


def cmd_eval(args) -> int:
    from ..train.evaluate import evaluate_checkpoint

    if args.json:
        writable_file(args.json, "--json")
    res = evaluate_checkpoint(
        args.checkpoint,
        args.data,
        model=args.model,
        ema=args.ema,
        batch_size=args.batch_size,
        split=args.split,
        img_size=args.img_size,
        crop_pct=args.crop_pct,
        eval_resize=args.eval_resize,
        device=args.device,
        amp=args.amp,
        workers=args.workers,
        json_path=args.json,
    )
    if res["n"] == 0:
        raise ValueError(f"--data {args.data}: no readable image to evaluate ({res['n_unreadable']} unreadable)")
    print(_eval_line(res))
    return 0


def cmd_demo(args) -> int:
    from ..train.task import train
    from ..train.evaluate import evaluate_checkpoint

    cfg_path = pathlib.Path(args.config) if args.config else configs_dir() / DEMO_CONFIG
    overrides = [("train.output", demo_output(args.output, "runs/demo", continuing=args.resume or args.overwrite))]
    if args.epochs:
        overrides.append(("sched.epochs", args.epochs))
    overrides += run_options(args)
    cfg = Config.load(cfg_path, overrides)
    t0 = time.time()
    print(
        f"demo: training {cfg.model.name} {cfg.model.kwargs} on Fashion-MNIST "
        f"({cfg.sched.epochs + cfg.sched.cooldown_epochs} epochs, config {cfg_path})",
        flush=True,
    )
    summary = train(cfg)
    if summary.get("stopped"):
        return exit_code(summary.get("signal"))
    out = pathlib.Path(summary["output"])
    if cfg.train.threads:  # evaluate with the threads the model trained with
        import torch

        torch.set_num_threads(cfg.train.threads)
    res = evaluate_checkpoint(
        out / "last.pth", f"fmnist:{cfg.data.path}" if cfg.data.path else "fmnist", batch_size=512
    )
    total = time.time() - t0
    print(
        f"\ndemo finished in {total / 60:.1f} min: test top-1 {res['top1']:.2f}%  top-5 {res['top5']:.2f}% "
        f"({res['n']} Fashion-MNIST test images)"
    )
    print(f"  checkpoint: {summary['checkpoint']}")
    print(f"  curves:     {out / 'curves.png'}")
    print(f"  summary:    {out / 'summary.json'}")
    print(f"  metrics:    {out / 'metrics.csv'}")
    print(f"  evaluate again: inline-attn eval --checkpoint {summary['checkpoint']} --data fmnist")
    return 0


def cmd_reproduce_ablations(args) -> int:
    from ..experiments.ablations import PARTS, run_ablations

    if args.quick and args.preset not in (None, "quick"):
        raise ValueError(f"--quick is --preset quick: it cannot go with --preset {args.preset}")
    res = run_ablations(
        args.preset or ("quick" if args.quick else "full"),
        output=args.output,
        parts=args.parts or PARTS,
        seeds=args.seeds,
        max_runs=args.max_runs,
        config_dir=args.configs,
        report_only=args.report_only,
        resume=args.resume,
        overwrite=args.overwrite,
    )
    print(res["report"])
    print(f"runs trained now: {res['trained']}, found finished: {res['skipped']}, still to run: {res['left']}")
    if res["left"]:
        print("continue with --resume auto")
    return exit_code(res["signal"])


def cmd_reproduce_fmnist(args) -> int:
    from ..experiments.reproduce import reproduce_fmnist

    _, stopped = reproduce_fmnist(
        output=args.output,
        epochs=args.epochs,
        variants=args.variants or list(FMNIST_VARIANTS),
        config_dir=args.configs,
    )
    return 0 if stopped is None else exit_code(stopped.get("signal"))


def _positive(kind, flag: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: expected a positive {kind.__name__}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: must be > 0")
        return value

    return parse


def _crop_pct(text: str) -> float:
    value = _positive(float, "--crop-pct")(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"--crop-pct {text!r}: must be in (0, 1]")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers {text!r}: expected an integer >= 0") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"--workers {text!r}: must be >= 0")
    return value


def register(subparsers) -> None:
    _register_train(subparsers)
    _register_eval(subparsers)
    _register_demo(subparsers)
    _register_reproduce(subparsers)


def _register_train(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        allow_abbrev=False,
        help="train a model from a YAML config",
        description="Train with a YAML config; --section.key VALUE overrides any key. "
        "Under torchrun the same command trains on every process. "
        "A run stopped by a signal saves a checkpoint and exits with 128 + "
        "the signal's number; --resume auto continues it.",
    )
    p.add_argument("-c", "--config", help="YAML config (configs/...); defaults for every key not set")
    p.add_argument("--resume", help="'auto' (continue from OUTPUT/last.pth, else previous.pth) or a checkpoint")
    p.add_argument("--output", help="output folder (= --train.output)")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP + " (= --train.overwrite true)")
    _add_override_options(p)
    p.set_defaults(func=cmd_train)


def _register_eval(subparsers) -> None:
    p = subparsers.add_parser(
        "eval",
        allow_abbrev=False,
        help="top-1/top-5 of a checkpoint",
        description="Evaluate a checkpoint on an ImageNet-layout folder (its val/ split "
        "if present) or on Fashion-MNIST ('fmnist' or 'fmnist:DIR'). "
        "Unreadable images are skipped and counted.",
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint file, training run folder or save_pretrained folder")
    p.add_argument(
        "--model",
        help="model name, for a checkpoint that names none (ours, a run folder's config.yaml and a save_pretrained "
        "folder's config.json name theirs: another name is refused)",
    )
    p.add_argument("--data", required=True, help="DIR (ImageNet layout) | fmnist | fmnist:DIR")
    p.add_argument("--split", help="subfolder of DIR (default val) or the Fashion-MNIST split (default test)")
    p.add_argument("--batch-size", type=_positive(int, "--batch-size"), default=256)
    p.add_argument("--img-size", type=_positive(int, "--img-size"))
    p.add_argument("--crop-pct", type=_crop_pct)
    p.add_argument(
        "--eval-resize",
        choices=["shorter", "squash"],
        help="shorter side to img_size / crop_pct (timm), or the whole image squashed to that square "
        "(the authors' evaluation; default: the checkpoint's config, else shorter)",
    )
    p.add_argument("--ema", action="store_true", help="evaluate the EMA weights")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--amp", default="none", choices=["none", "bf16", "fp16"])
    p.add_argument("--workers", type=_non_negative_int, help="loader processes of a folder (default 2)")
    p.add_argument("--json", help="also write the result to this JSON file")
    p.set_defaults(func=cmd_eval)


def _register_demo(subparsers) -> None:
    p = subparsers.add_parser("demo", help="train the default InLine model on Fashion-MNIST and evaluate it")
    p.add_argument("--output", help="output folder (default runs/demo, or runs/demo-2, ... beside earlier demos)")
    p.add_argument("--epochs", type=_positive(int, "--epochs"), help="override the config's epochs")
    p.add_argument("--config", help=f"config (default configs/{DEMO_CONFIG})")
    p.add_argument("--resume", help="'auto' to continue an interrupted demo")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p.set_defaults(func=cmd_demo)


def _register_reproduce(subparsers) -> None:
    p = subparsers.add_parser(
        "reproduce",
        help="fmnist: train the four Fashion-MNIST variants and tabulate them; ablations: the paper's "
        "ablations and comparisons over several seeds (resumable)",
    )
    targets = p.add_subparsers(dest="target", metavar="TARGET")
    targets.required = True
    p = targets.add_parser(
        "fmnist",
        allow_abbrev=False,
        help="the four Fashion-MNIST variants, one table (OUTPUT/report.md)",
        description="Train the four attention variants of configs/fmnist with one budget and tabulate them into "
        "OUTPUT/report.md; running it again continues where it stopped.",
    )
    p.add_argument("--output", default="runs/fmnist", help="one subfolder per variant (default runs/fmnist)")
    p.add_argument(
        "--epochs",
        type=_positive(int, "--epochs"),
        help="the same epoch budget for every variant (default: the configs')",
    )
    p.add_argument("--variants", nargs="+", choices=list(FMNIST_VARIANTS), help="the variants to train (default: all)")
    p.add_argument("--configs", help="configs folder (default: found automatically)")
    p.set_defaults(func=cmd_reproduce_fmnist)
    p = targets.add_parser(
        "ablations",
        allow_abbrev=False,
        help="the paper's ablations over several seeds (resumable; OUTPUT/report.md)",
        description="Train every (setting, seed) of the chosen parts that is not finished, then tabulate the "
        "finished ones into OUTPUT/report.md (docs/reproduction.md describes the parts and presets).",
    )
    p.add_argument("--output", help="the runs' folder (default runs/ablations/<preset>)")
    p.add_argument("--configs", help="configs folder (default: found automatically)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="the smoke preset (1,024 training images per run; its wall time is in docs/reproduction.md)",
    )
    p.add_argument(
        "--preset",
        help="full (default), quick (= --quick) or gpu (10x the full budget per run, on CUDA; docs/reproduction.md)",
    )
    p.add_argument("--seeds", type=_positive(int, "--seeds"), default=3, help="seeds per setting (default 3)")
    p.add_argument("--parts", help="letters of the parts to run (default abcdefg)")
    p.add_argument("--max-runs", type=int, default=0, help="stop after training this many runs (default 0: no limit)")
    p.add_argument("--report-only", action="store_true", help="train nothing, tabulate the finished runs")
    p.add_argument("--resume", choices=["auto"], help="continue the runs in --output")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p.set_defaults(func=cmd_reproduce_ablations)
