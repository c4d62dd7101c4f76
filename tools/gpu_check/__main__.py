"""``python -m tools.gpu_check``: :func:`.runner.main`."""

import sys

from .runner import main

sys.exit(main())
