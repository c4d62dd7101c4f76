"""The ``inline-attn`` command. Subcommands only call the public API.

One thin module per command group (``models``, ``ops``, ``analyze``, ``bench``, ``train``, ``dense``)
contributes its subcommands through a ``register(subparsers)`` function listed in
:data:`SUBCOMMAND_MODULES`; the parser sets ``func`` to run with the parsed arguments. The command
modules are imported only when the parser is built, so importing one of them costs no other.
``python -m inline_attn.cli`` runs :func:`main`; :mod:`.torchrun` is the quiet torchrun launcher.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# module path -> provides register(subparsers); add a line when a subsystem gains commands.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "inline_attn.cli.models",
    "inline_attn.cli.ops",
    "inline_attn.cli.analyze",
    "inline_attn.cli.bench",
    "inline_attn.cli.train",
    "inline_attn.cli.dense",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inline-attn",
        description="InLine attention: models, training, analyses and benchmarks.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in SUBCOMMAND_MODULES:
        importlib.import_module(mod).register(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except ValueError as e:  # user errors: one clear line, no traceback
        print(f"inline-attn: error: {e}", file=sys.stderr)
        return 2
    return int(rc or 0)
