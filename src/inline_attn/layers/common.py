"""Small building blocks shared by every model family."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from ..ops import check_count


def check_heads(dim: int, num_heads: int) -> int:
    """Validate integer ``dim`` and ``num_heads`` with ``dim % num_heads == 0``; return the head dim."""
    check_count("dim", dim, 1)
    check_count("num_heads", num_heads, 1)
    if dim % num_heads != 0:
        raise ValueError(f"dim={dim} must be a positive multiple of num_heads={num_heads}")
    return dim // num_heads


def check_flag(name: str, value, *, optional: bool = False) -> Optional[bool]:
    """``value``, a bool (or None where ``optional``), else a ValueError naming ``name``: a string
    such as ``"no"`` is truthy and would turn the option on (create_model refuses it alike)."""
    if isinstance(value, bool) or (optional and value is None):
        return value
    raise ValueError(f"{name} must be a bool{' or None' if optional else ''}, got {value!r}")


def to_2tuple(x) -> tuple[int, int]:
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise ValueError(f"expected an int or a pair, got {x!r}")
        return int(x[0]), int(x[1])
    return int(x), int(x)


def drop_path_rates(rate: float, blocks: int) -> list[float]:
    """Stochastic depth rising linearly from 0 to ``rate`` over ``blocks`` blocks, in plain Python
    (no tensor: a model built under ``FakeTensorMode`` or on the meta device has no values to read)."""
    return [rate * i / max(blocks - 1, 1) for i in range(blocks)]


def drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Stochastic depth: zero whole samples with probability p, rescale the rest by 1/(1-p)."""
    if p == 0.0 or not training:
        return x
    keep = 1.0 - p
    mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
    return x * mask.div_(keep)


class DropPath(nn.Module):
    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Mlp(nn.Module):
    """Linear -> GELU -> Dropout -> Linear -> Dropout (state-dict names fc1, fc2 as in timm)."""

    def __init__(
        self,
        in_features: int,
        hidden_features: int | None = None,
        out_features: int | None = None,
        act_layer=nn.GELU,
        drop: float = 0.0,
    ):
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class PreNormBlock(nn.Module):
    """Pre-norm transformer block: ``x + drop_path(attn(norm1(x), feat_size))``, then
    ``x + drop_path(mlp(norm2(x)))``; x: [B, N, C]. Families pass the attention module they built
    (state-dict names norm1, attn, norm2, mlp.fc1, mlp.fc2 as in the references)."""

    def __init__(
        self,
        dim: int,
        attn: nn.Module,
        *,
        mlp_ratio: float = 4.0,
        drop: float = 0.0,
        drop_path: float = 0.0,
        norm_layer=nn.LayerNorm,
    ):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = attn
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)

    def forward(self, x: torch.Tensor, feat_size: tuple[int, int]) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), feat_size))
        return x + self.drop_path(self.mlp(self.norm2(x)))


def trunc_normal_(t: torch.Tensor, std: float) -> torch.Tensor:
    """``nn.init.trunc_normal_(t, std=std)`` (within two units, not two std, as timm's ViT init); a
    fake tensor (a model built under ``FakeTensorMode``) is left as it is: it has no values to draw,
    and the draw's rejection step would read them."""
    from torch._subclasses.fake_tensor import is_fake

    return t if is_fake(t) else nn.init.trunc_normal_(t, std=std)


def init_weights_(module: nn.Module) -> None:
    """The reference models' initialisation (timm's ViT init), in place.

    Linear weights trunc-normal(std 0.02) with zero biases, LayerNorm weight 1 / bias 0, visited in
    ``module.modules()`` order; convolutions (patch stems, the residual predictor) keep PyTorch's
    default init; learnable feature maps (:class:`AffineReLUFeatureMap`) keep their identity start.
    """
    from .feature_maps import AffineReLUFeatureMap  # here to keep common.py free of layer imports

    for m in module.modules():
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    for m in module.modules():
        if isinstance(m, AffineReLUFeatureMap):
            m.reset_parameters()
