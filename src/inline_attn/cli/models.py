"""``inline-attn list [PATTERN]`` and ``inline-attn info NAME``: the model zoo on the command line."""

from __future__ import annotations

import argparse
import json


def _cmd_list(args: argparse.Namespace) -> int:
    from ..models import list_models
    from ..models.registry import model_table

    names = list_models(args.pattern)
    if not names:
        raise ValueError(f"no registered model matches {args.pattern!r}")
    print(model_table(names) if args.verbose else "\n".join(names))
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    if args.name.endswith((".yaml", ".yml")):  # a segmentation config: its segmentor's parameters
        from ..dense.seg_task import format_segmentor_info, segmentor_info

        if args.img_size:
            raise ValueError(f"--img-size: a segmentation config ({args.name}) is profiled at its crop size")

        info = segmentor_info(args.name, macs=not args.no_macs)
        print(json.dumps(info, indent=1) if args.json else format_segmentor_info(info))
        return 0
    from ..models.profile import format_model_info, model_info

    info = model_info(args.name, args.img_size, macs=not args.no_macs)
    print(json.dumps(info, indent=1, default=list) if args.json else format_model_info(info))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("list", help="list registered models", description="List registered models.")
    p.add_argument("pattern", nargs="?", default="*", help="fnmatch pattern (default: all), e.g. 'inline_pvt_*'")
    p.add_argument("-v", "--verbose", action="store_true", help="with input size, params, MACs, paper top-1")
    p.set_defaults(func=_cmd_list)

    p = subparsers.add_parser(
        "info",
        help="a model's parameters, MACs and config",
        description="Build a registered model and report its parameters, counted MACs and config.",
    )
    p.add_argument(
        "name",
        help="registered model name (see `inline-attn list`), or a segmentation config "
        "(configs/ade20k/*.yaml): its segmentor's parameters by part",
    )
    p.add_argument("--img-size", type=int, nargs=2, metavar=("H", "W"), help="profile at this input size")
    p.add_argument("--no-macs", action="store_true", help="skip the MAC count (faster)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_info)
