"""``inline-attn list [PATTERN]`` and ``inline-attn info NAME``: the model zoo on the command line."""

from __future__ import annotations

import argparse
import json


def _cmd_list(args: argparse.Namespace) -> int:
    from ..models import get_model_config, list_models

    names = list_models(args.pattern)
    if not names:
        raise ValueError(f"no registered model matches {args.pattern!r}")
    if args.verbose:
        print(f"{'model':26s} {'input':>5s} {'params':>12s} {'GMACs':>7s} {'top-1':>6s}")
        for n in names:
            c = get_model_config(n)
            params = f"{c.num_params:,}" if c.num_params else "-"
            macs = f"{c.macs_g:.2f}" if c.macs_g else "-"
            top1 = f"{c.paper_top1:.1f}" if c.paper_top1 else "-"
            print(f"{n:26s} {c.input_size[-1]:5d} {params:>12s} {macs:>7s} {top1:>6s}")
    else:
        print("\n".join(names))
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    if args.name.endswith((".yaml", ".yml")):  # a segmentation config: its segmentor's parameters
        from ..dense.seg_task import format_segmentor_info, segmentor_info

        info = segmentor_info(args.name, macs=not args.no_macs)
        print(json.dumps(info, indent=1) if args.json else format_segmentor_info(info))
        return 0
    from ..models import create_model, get_model_config
    from ..models.profile import profile

    cfg = get_model_config(args.name)
    model = create_model(args.name)
    size = cfg.input_size if args.img_size is None else (cfg.input_size[0], *args.img_size)
    if args.no_macs:
        from ..models.profile import count_params

        params, macs = count_params(model), None
    else:
        res = profile(model, size)
        params, macs = res.params, res.macs
    info = {
        "name": cfg.name,
        "params": params,
        "macs": macs,
        "gmacs": None if macs is None else round(macs / 1e9, 4),
        "profiled_input_size": list(size),
        "config": cfg.to_dict(),
    }
    if args.json:
        print(json.dumps(info, indent=1, default=list))
        return 0
    print(f"{cfg.name} ({cfg.family})")
    print(f"  params        {params:,}" + (f"  (reference {cfg.num_params:,})" if cfg.num_params else ""))
    if macs is not None:
        ref = f"  (published {cfg.macs_g:.2f} G at {cfg.input_size[-1]})" if cfg.macs_g else ""
        print(f"  MACs          {macs / 1e9:.3f} G at {size[1]}x{size[2]}{ref}")
    for key, val in cfg.to_dict().items():
        if key not in ("name", "family", "num_params", "macs_g"):
            print(f"  {key:13s} {val}")
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
