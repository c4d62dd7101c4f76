"""OpenMMLab plugin: the InLine backbones in mmsegmentation's (and mmdetection's) registries.

Importing this module registers ``InLineBackbone`` in ``mmseg.registry.MODELS`` and, when
mmdetection is installed, in ``mmdet.registry.MODELS``. In an mmseg / mmdet config::

    custom_imports = dict(imports=["inline_attn.dense.mm"], allow_failed_imports=False)
    model = dict(backbone=dict(type="InLineBackbone", name="inline_pvt_tiny", drop_path_rate=0.1,
                               init_cfg=dict(type="Pretrained", checkpoint="inline_pvt_tiny.pth")))

Needs the optional extra ``pip install "inline-attn[mm]"`` (mmengine 0.10.7, mmsegmentation
1.2.2, mmdet 3.3.0, pycocotools, ftfy, regex) and mmcv 2.1.0 built from source with its ops
(docs/dense.md gives the recipe). The configs of the paper's recipes are in ``configs/ade20k/mm/``
(segmentation) and ``configs/coco/mm/`` (Mask R-CNN, Cascade Mask R-CNN).
"""

from __future__ import annotations

from typing import Optional

try:
    from mmengine.model import BaseModule
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "inline_attn.dense.mm needs mmengine and mmsegmentation: pip install 'inline-attn[mm]' and mmcv 2.1.0 "
        "built from source (see docs/dense.md)"
    ) from e

from .models.backbone import DenseBackbone

__all__ = ["InLineBackbone", "REGISTERED"]


class InLineBackbone(BaseModule):
    """:class:`~inline_attn.dense.DenseBackbone` as an OpenMMLab backbone.

    Args:
        name: registered model (``inline-attn list``).
        init_cfg: ``dict(type="Pretrained", checkpoint=PATH)`` loads a classification checkpoint
            (ours or the authors') into the backbone through :func:`inline_attn.load_checkpoint`
            (DenseBackbone's ``pretrained``, which is not taken here).
        **backbone_kwargs: DenseBackbone's, with its defaults (out_indices, frozen_stages,
            norm_eval, drop_path_rate, out_norms; the rest goes to :func:`inline_attn.create_model`).

    forward: images [B, 3, H, W] -> tuple of NCHW maps at strides 4, 8, 16, 32.
    """

    def __init__(self, name: str, init_cfg: Optional[dict] = None, **backbone_kwargs):
        if "pretrained" in backbone_kwargs:
            raise ValueError("InLineBackbone takes its checkpoint as init_cfg=dict(type='Pretrained', checkpoint=PATH)")
        pretrained = None
        if init_cfg is not None:
            if not isinstance(init_cfg, dict) or init_cfg.get("type") != "Pretrained" or "checkpoint" not in init_cfg:
                raise ValueError(
                    f"InLineBackbone init_cfg must be dict(type='Pretrained', checkpoint=PATH), got {init_cfg!r}"
                )
            pretrained = init_cfg["checkpoint"]
        super().__init__(init_cfg=None)  # the weights load here, not through mmengine's initialisers
        self.inner = DenseBackbone(name, pretrained=pretrained, **backbone_kwargs)
        self.out_channels = self.inner.out_channels

    def init_weights(self) -> None:
        """The backbone keeps its own initialisation (or the pretrained weights)."""

    def train(self, mode: bool = True):
        super().train(mode)
        self.inner.train(mode)  # frozen stages and norm_eval
        return self

    def forward(self, x):
        return tuple(self.inner(x))


REGISTERED: list[str] = []


def _register() -> None:
    for pkg in ("mmseg", "mmdet"):
        try:
            registry = __import__(f"{pkg}.registry", fromlist=["MODELS"]).MODELS
        except ImportError:
            continue
        registry.register_module(name="InLineBackbone", module=InLineBackbone, force=True)
        REGISTERED.append(pkg)


_register()
