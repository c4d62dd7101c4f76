"""The ``inline-attn`` command. Subcommands only call the public API.

One thin module per command group (``models``, ``ops``, ``analyze``, ``bench``, ``train``, ``dense``)
contributes its subcommands through a ``register(subparsers)`` function; :data:`COMMANDS` names the
module of each command with its one-line help. :func:`main` imports only the module of the command
it runs (``inline-attn --help`` imports none: it starts in a fraction of a second, without torch);
the parser sets ``func`` to run with the parsed arguments. ``python -m inline_attn.cli`` runs
:func:`main`; :mod:`.torchrun` is the quiet torchrun launcher.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

from .._io import WriteFailed

# command -> (the module whose register(subparsers) adds it, its help in `inline-attn --help`); a test
# checks each help against the module's own
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("inline_attn.cli.models", "list registered models"),
    "info": ("inline_attn.cli.models", "a model's parameters, MACs and config"),
    "build-kernel": ("inline_attn.cli.ops", "build the fused CPU kernel now (else the first model call builds it)"),
    "analyze": (
        "inline_attn.cli.analyze",
        "the paper's analyses: injectivity, confusion, attention maps, locality, masking",
    ),
    "bench": ("inline_attn.cli.bench", "benchmarks: attention layers and whole models"),
    "train": ("inline_attn.cli.train", "train a model from a YAML config"),
    "eval": ("inline_attn.cli.train", "top-1/top-5 of a checkpoint"),
    "demo": ("inline_attn.cli.train", "train the default InLine model on Fashion-MNIST and evaluate it"),
    "reproduce": (
        "inline_attn.cli.train",
        "fmnist: train the four Fashion-MNIST variants and tabulate them; ablations: the paper's "
        "ablations and comparisons over several seeds (resumable)",
    ),
    "seg": ("inline_attn.cli.dense", "semantic segmentation: train | eval | demo | compare | mosaics | info"),
    "det": ("inline_attn.cli.dense", "object detection (FCOS): train | eval | demo | compare"),
}


def build_parser(argv: Optional[Sequence[str]] = None) -> argparse.ArgumentParser:
    """The parser. With ``argv`` (a command line), only the module of the command it names is
    imported and registered, the other commands are listed by name and help (``--help`` alone
    imports none); without, every command's own arguments are there."""
    parser = argparse.ArgumentParser(
        prog="inline-attn",
        description="InLine attention: models, training, analyses and benchmarks.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    wanted = {m for m, _ in COMMANDS.values()}
    if argv is not None:
        chosen = next((a for a in argv if not a.startswith("-")), None)
        wanted = {COMMANDS[chosen][0]} if chosen in COMMANDS else set()
    registered = set()
    for name, (module, help) in COMMANDS.items():
        if module in wanted and module not in registered:
            importlib.import_module(module).register(sub)
            registered.add(module)
        elif module not in wanted:
            sub.add_parser(name, help=help, add_help=False)
    return parser


def main(argv=None) -> int:
    args = build_parser(sys.argv[1:] if argv is None else list(argv)).parse_args(argv)
    try:
        rc = args.func(args)
    # user errors, and a write the disk refused (full, read-only: the message names the file and the
    # cause, and says the previous file is kept): one clear line, no traceback
    except (ValueError, WriteFailed) as e:
        print(f"inline-attn: error: {e}", file=sys.stderr)
        return 2
    return int(rc or 0)
