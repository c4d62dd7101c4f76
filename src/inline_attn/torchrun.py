"""``python -m inline_attn.torchrun ...``: the documented name of :mod:`inline_attn.cli.torchrun`."""

import sys

from .cli.torchrun import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
