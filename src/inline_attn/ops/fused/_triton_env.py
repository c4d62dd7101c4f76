"""Choose Triton's interpreter before anything imports triton, on machines without CUDA.

Triton decides at import time whether its kernels (its own ``tl`` helpers included) are compiled
for a GPU or interpreted on the CPU (``TRITON_INTERPRET=1``); torch imports triton early (the FLOP
counter does). Without a CUDA device triton can only interpret, so when this module runs first
and the variable is unset it sets it: ``impl="triton"`` then runs on CPU tensors. With a CUDA
device, or when triton is already imported, nothing changes.
"""

from __future__ import annotations

import os
import sys

import torch

if "triton" not in sys.modules and "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
