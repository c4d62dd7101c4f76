"""``python -m inline_attn.cli ...``: the ``inline-attn`` command (torchrun's ``-m`` target too)."""

import sys

from . import main

sys.exit(main())
