"""``inline-attn build-kernel``: build the fused CPU kernel ahead of the first model call."""

from __future__ import annotations

import argparse
import os
import sys


def _cmd_build_kernel(args: argparse.Namespace) -> int:
    from ..ops.fused import cpu as cpu_kernel, cpu_build

    if args.cache:
        os.environ["INLINE_ATTN_KERNEL_CACHE"] = os.path.abspath(args.cache)
    try:
        path = cpu_build.build_cpu_kernel(force=args.force, verbose=args.verbose, lock_timeout=args.lock_timeout)
    except cpu_build.KernelBuildError as e:
        print(f"inline-attn: error: {e}", file=sys.stderr)
        return 1
    if not cpu_kernel.cpu_kernel_available():  # loads it and checks that it registers the ops
        print(f"inline-attn: error: {cpu_kernel.cpu_kernel_error()}", file=sys.stderr)
        return 1
    print(path)
    if args.cache:
        print(f"use it with INLINE_ATTN_KERNEL_CACHE={os.environ['INLINE_ATTN_KERNEL_CACHE']}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "build-kernel",
        help="build the fused CPU kernel now (else the first model call builds it)",
        description="Compile the fused InLine CPU kernel for this install and CPU into the kernel cache "
        "($INLINE_ATTN_KERNEL_CACHE, else ~/.cache/inline_attn/kernels) and print its path. "
        "A kernel already there is reused (nothing is rebuilt unless --force).",
    )
    p.add_argument(
        "--cache",
        metavar="DIR",
        help="cache folder (default: $INLINE_ATTN_KERNEL_CACHE or ~/.cache/inline_attn/kernels)",
    )
    p.add_argument("--force", action="store_true", help="rebuild even when the cache holds the kernel")
    p.add_argument("--verbose", action="store_true", help="print the compiler command")
    p.add_argument(
        "--lock-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds to wait for another process building the same kernel (default 600)",
    )
    p.set_defaults(func=_cmd_build_kernel)
