"""Feature maps phi applied to queries and keys (paper Sec. 3, Table 1).

The published InLine models all use ``identity``. ``exp`` is ``exp(0.2 x)`` as in the reference.
A learnable ``relu(A x + b)`` kernel lives in :class:`inline_attn.layers.AffineReLUKernel`, because
it has parameters; the functional ops accept any callable as ``kernel``.
"""

from __future__ import annotations

from typing import Callable, Union

import torch
import torch.nn.functional as F

Kernel = Union[str, Callable[[torch.Tensor], torch.Tensor], None]


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _exp(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(0.2 * x)


KERNELS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": _identity,
    "relu": F.relu,
    "leakyrelu": F.leaky_relu,  # PyTorch default negative slope 0.01, as in the reference
    "exp": _exp,
}


def get_kernel(kernel: Kernel) -> Callable[[torch.Tensor], torch.Tensor]:
    """Resolve ``kernel`` (a name from :data:`KERNELS`, a callable, or None = identity)."""
    if kernel is None:
        return _identity
    if callable(kernel):
        return kernel
    if isinstance(kernel, str) and kernel in KERNELS:
        return KERNELS[kernel]
    raise ValueError(f"unknown kernel {kernel!r}: expected one of {sorted(KERNELS)} or a callable")
