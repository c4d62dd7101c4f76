"""A dense-prediction backbone over any registered model's ``features_only`` form.

:class:`DenseBackbone` builds ``create_model(name, features_only=True, ...)`` and returns four
NCHW maps at strides 4, 8, 16, 32 for every family:

- PVT, Swin and CSwin give them directly (Swin and CSwin also get one LayerNorm per returned map,
  as their detection / segmentation code adds: ``norm0`` .. ``norm3``);
- DeiT gives one stride-16 map; :class:`SimpleFeaturePyramid` (ViTDet's "simple feature
  pyramid", Li et al. 2022) turns it into four: 2 transposed convs (stride 4), 1 (stride 8),
  identity (stride 16), 2x2 max-pool (stride 32).

What differs between the families is stated by the models themselves
(:class:`~inline_attn.models._base.InLineModel`'s ``single_scale``, ``dense_out_norms`` and
``stage_prefixes``); this module names no family.

It adds the OpenMMLab backbone options: ``frozen_stages`` (-1: none; 0: the stem; k: the stem and
the first k stages, kept in eval mode and without gradients), ``norm_eval`` (BatchNorm layers
stay in eval mode while training; the families here use LayerNorm, which has no running
statistics, so this only matters for BatchNorm added around them) and ``drop_path_rate``.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...models import create_model

__all__ = ["DenseBackbone", "LayerNorm2d", "SimpleFeaturePyramid"]


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW map. x: [B, C, H, W] -> [B, C, H, W]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps).permute(0, 3, 1, 2)


class SimpleFeaturePyramid(nn.Module):
    """ViTDet's simple feature pyramid from one stride-16 map.

    x: [B, C, H, W] (stride 16) -> maps [B, C, 4H, 4W], [B, C, 2H, 2W], [B, C, H, W],
    [B, C, H/2, W/2] (strides 4, 8, 16, 32; the max-pool floors odd sides). The input is first
    normalised (the features_only DeiT has no final norm).
    """

    def __init__(self, dim: int):
        super().__init__()
        self.norm = LayerNorm2d(dim, eps=1e-6)
        self.fpn1 = nn.Sequential(
            nn.ConvTranspose2d(dim, dim, 2, stride=2),
            LayerNorm2d(dim, eps=1e-6),
            nn.GELU(),
            nn.ConvTranspose2d(dim, dim, 2, stride=2),
        )
        self.fpn2 = nn.ConvTranspose2d(dim, dim, 2, stride=2)
        self.fpn4 = nn.MaxPool2d(2, ceil_mode=True)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.norm(x)
        return [self.fpn1(x), self.fpn2(x), x, self.fpn4(x)]


class DenseBackbone(nn.Module):
    """Four feature maps (strides 4, 8, 16, 32) from a registered InLine / softmax model.

    Args:
        name: a registered model (``inline-attn list``), e.g. "inline_pvt_tiny".
        out_indices: which of the four maps to return (default all).
        frozen_stages: -1 none; 0 the stem; k >= 1 the stem and stages 0..k-1.
        norm_eval: keep BatchNorm layers in eval mode during training.
        drop_path_rate: stochastic depth of the backbone (None: the variant's default).
        pretrained: a checkpoint of the classification model (ours or the authors'), a path or
            a URL (downloaded once into torch.hub's cache), or True for the authors' released
            ImageNet-1k weights of ``name``; loaded strictly apart from what ``features_only``
            prunes (head, final norm).
        weights_only: refuse pickled non-tensor objects in ``pretrained`` (torch.load's rule);
            False for files you trust, e.g. ``last.pth`` of ``inline-attn train`` (it stores a
            config and RNG states beside the weights).
        out_norms: a LayerNorm on each returned map (None: the model's ``dense_out_norms``, on
            for Swin and CSwin, as their dense-prediction code; the DeiT pyramid has its own
            input norm).
        **model_kwargs: passed to :func:`inline_attn.create_model` (pattern, embed_dims, img_size, ...).

    forward: images [B, C_in, H, W] -> list of [B, C_i, H / s_i, W / s_i] for the strides s_i of
    ``out_indices`` (sides the stride does not divide: each family pads, so the maps cover the
    image; :class:`~inline_attn.dense.EncoderDecoder` pads its inputs to a multiple of 32 first).
    """

    def __init__(
        self,
        name: str,
        *,
        out_indices: Sequence[int] = (0, 1, 2, 3),
        frozen_stages: int = -1,
        norm_eval: bool = False,
        drop_path_rate: Optional[float] = None,
        pretrained: Union[bool, str, None] = None,
        weights_only: bool = True,
        out_norms: Optional[bool] = None,
        **model_kwargs,
    ):
        super().__init__()
        self.name = name
        self.out_indices = tuple(int(i) for i in out_indices)
        if (
            not self.out_indices
            or any(i not in range(4) for i in self.out_indices)
            or len(set(self.out_indices)) < len(self.out_indices)
        ):
            raise ValueError(f"out_indices={tuple(out_indices)} must be a non-empty subset of (0, 1, 2, 3)")
        if not -1 <= frozen_stages <= 4:
            raise ValueError(f"frozen_stages={frozen_stages} must be in [-1, 4]")
        self.frozen_stages, self.norm_eval = int(frozen_stages), bool(norm_eval)
        kwargs = dict(model_kwargs)
        if drop_path_rate is not None:
            kwargs["drop_path_rate"] = float(drop_path_rate)
        self.pyramid: Optional[SimpleFeaturePyramid] = None
        body = create_model(name, features_only=True, **kwargs)  # every level's map
        if body.single_scale:  # a pyramid from the last map (DeiT: the last block, stride 16)
            dim, stride = body.feature_info[-1]["num_chs"], body.feature_info[-1]["reduction"]
            self.pyramid = SimpleFeaturePyramid(dim)
            self.channels_all = [dim] * 4
            self.strides_all = [stride // 4, stride // 2, stride, stride * 2]
        else:
            if len(body.feature_info) != 4:
                raise ValueError(
                    f"{name} has {len(body.feature_info)} levels: a dense backbone takes 4 (or one stride)"
                )
            self.channels_all = [f["num_chs"] for f in body.feature_info]
            self.strides_all = [f["reduction"] for f in body.feature_info]
        self.body = body
        if pretrained:
            from ...models.checkpoint import load_checkpoint
            from ...models.weights import published_url, weights_file

            source = published_url(name) if pretrained is True else pretrained
            load_checkpoint(body, weights_file(source, model_name=name), strict=True, weights_only=weights_only)
        if out_norms is None:
            out_norms = body.dense_out_norms
        self.norms = nn.ModuleList(
            [LayerNorm2d(self.channels_all[i]) if out_norms else nn.Identity() for i in self.out_indices]
        )
        self.out_channels = [self.channels_all[i] for i in self.out_indices]
        self.strides = [self.strides_all[i] for i in self.out_indices]
        self._freeze()

    # ---- OpenMMLab backbone options --------------------------------------------------------

    def _frozen_prefixes(self) -> list[str]:
        if self.frozen_stages < 0:
            return []
        stem, stages = self.body.stage_prefixes()
        out = ["body." + p for p in stem]
        for i in range(self.frozen_stages):
            out += ["body." + p for p in stages[i]]
            if i in self.out_indices:  # the stage's output norm goes with it
                out.append(f"norms.{self.out_indices.index(i)}.")
        return out

    def _frozen_modules(self) -> list[nn.Module]:
        prefixes = self._frozen_prefixes()
        prefixes = [p for p in prefixes if p.endswith(".")]
        return [m for n, m in self.named_modules() if n and any((n + ".").startswith(p) for p in prefixes)]

    def _freeze(self) -> None:
        prefixes = self._frozen_prefixes()
        for n, p in self.named_parameters():
            if any(n.startswith(pre) and (pre.endswith(".") or n == pre) for pre in prefixes):
                p.requires_grad_(False)
        for m in self._frozen_modules():
            m.eval()

    def train(self, mode: bool = True) -> "DenseBackbone":
        super().train(mode)
        if mode:
            for m in self._frozen_modules():
                m.eval()
            if self.norm_eval:
                for m in self.modules():
                    if isinstance(m, nn.modules.batchnorm._BatchNorm):
                        m.eval()
        return self

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Position embeddings, cls token and relative-position tables (names in this module)."""
        inner = self.body.no_weight_decay() if hasattr(self.body, "no_weight_decay") else set()
        return {"body." + n for n in inner}

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.body.set_grad_checkpointing(enable)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.pyramid is not None:
            maps = self.pyramid(self.body(x)[-1])
        else:
            maps = self.body(x)
        return [norm(maps[i]) for norm, i in zip(self.norms, self.out_indices)]

    def extra_repr(self) -> str:
        return (
            f"name={self.name}, out_channels={self.out_channels}, strides={self.strides}, "
            f"frozen_stages={self.frozen_stages}, norm_eval={self.norm_eval}"
        )
