"""The options a family's block takes as keywords and hands on, to its attention layer and its MLP.

Every family (DeiT, PVT, Swin, CSwin) threads the same options from the model through the block to
the attention layer. :class:`BlockOptions` declares them once. A block takes them as ``**options``
(``BlockOptions(**options)``: an unknown name is a ``TypeError``) and splits them with
:meth:`BlockOptions.attention`, :meth:`BlockOptions.softmax` and :meth:`BlockOptions.mlp`, so a new
option is one field here, not an edit in every block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch.nn as nn


@dataclass(frozen=True)
class BlockOptions:
    """A transformer block's options beside its dim, heads and attention kind.

    Args:
        mlp_ratio: MLP hidden width / dim.
        qkv_bias: bias of the q/k/v projection.
        feature_map: phi of InLine / linear attention (None: the kind's default).
        local_residual: the predicted 3x3 local residual (None: on for InLine only).
        drop: dropout in the MLP and after the attention's output projection.
        attn_drop: dropout on softmax weights.
        drop_path: stochastic depth rate of the block.
        norm_layer: the block's two norms (``nn.LayerNorm``; DeiT and PVT pass eps 1e-6).
    """

    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    feature_map: Optional[str] = None
    local_residual: Optional[bool] = None
    drop: float = 0.0
    attn_drop: float = 0.0
    drop_path: float = 0.0
    norm_layer: Callable[[int], nn.Module] = nn.LayerNorm

    def attention(self) -> dict:
        """Keywords of an InLine / linear / other-kind attention layer (``TokenAttention``'s)."""
        return dict(self.softmax(), feature_map=self.feature_map, local_residual=self.local_residual)

    def softmax(self) -> dict:
        """Keywords of a plain softmax attention layer (no feature map, no local residual)."""
        return dict(qkv_bias=self.qkv_bias, attn_drop=self.attn_drop, proj_drop=self.drop)

    def mlp(self) -> dict:
        """Keywords of :class:`~inline_attn.layers.PreNormBlock` beside its dim and attention."""
        return dict(mlp_ratio=self.mlp_ratio, drop=self.drop, drop_path=self.drop_path, norm_layer=self.norm_layer)
