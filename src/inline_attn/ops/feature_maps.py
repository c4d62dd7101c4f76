"""Feature maps phi applied to queries and keys (paper Sec. 3, Table 1).

The published InLine models all use ``identity``. ``exp`` is ``exp(0.2 x)`` as in the reference.
A learnable ``relu(A x + b)`` feature map lives in :class:`inline_attn.layers.AffineReLUFeatureMap`,
because it has parameters; the functional ops accept any callable as ``feature_map``.
"""

from __future__ import annotations

from typing import Callable, Union

import torch
import torch.nn.functional as F


FeatureMap = Union[str, Callable[[torch.Tensor], torch.Tensor], None]


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _exp(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(0.2 * x)


FEATURE_MAPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": _identity,
    "relu": F.relu,
    "leakyrelu": F.leaky_relu,  # PyTorch default negative slope 0.01, as in the reference
    "exp": _exp,
}


def get_feature_map(feature_map: FeatureMap) -> Callable[[torch.Tensor], torch.Tensor]:
    """Resolve ``feature_map`` (a name from :data:`FEATURE_MAPS`, a callable, or None = identity)."""
    if feature_map is None:
        return _identity
    if callable(feature_map):
        return feature_map
    if isinstance(feature_map, str) and feature_map in FEATURE_MAPS:
        return FEATURE_MAPS[feature_map]
    raise ValueError(f"unknown feature map {feature_map!r}: expected one of {sorted(FEATURE_MAPS)} or a callable")
