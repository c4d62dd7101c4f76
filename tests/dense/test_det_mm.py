"""The mmdetection plugin: runs only where mmdet (with mmcv's ops) imports; the outcome of a run
with mmdet installed is recorded in docs/dense.md."""

from __future__ import annotations

import pathlib

import pytest
import torch

pytest.importorskip("mmdet.models", reason="mmdetection / mmcv (the optional mm extra) not installed")

from mmengine.config import Config  # noqa: E402

CONFIGS = pathlib.Path(__file__).parents[2] / "configs" / "coco" / "mm"
TINY_PVT = dict(
    embed_dims=(16, 16, 32, 32), num_heads=(1, 1, 2, 2), mlp_ratios=(2, 2, 2, 2), depths=(1, 1, 1, 1), img_size=64
)
ALL = sorted(p.name for p in CONFIGS.glob("*.py") if not p.name.startswith("_"))


def _model_cfg(name: str, *, tiny: bool = False, num_classes: int = 80):
    from mmdet.utils import register_all_modules

    register_all_modules()
    cfg = Config.fromfile(str(CONFIGS / name))  # custom_imports loads inline_attn.dense.mm
    m = cfg.model
    heads = m.roi_head.bbox_head if isinstance(m.roi_head.bbox_head, list) else [m.roi_head.bbox_head]
    for h in heads:
        h["num_classes"] = num_classes
        if "norm_cfg" in h:
            h["norm_cfg"] = dict(type="BN", requires_grad=True)  # SyncBN needs a process group
    m.roi_head.mask_head.num_classes = num_classes
    if tiny:
        m.backbone.update(TINY_PVT, name="inline_pvt_tiny", drop_path_rate=0.0)
        m.neck.in_channels = [16, 16, 32, 32]
        m.neck.out_channels = 32
        m.rpn_head.update(in_channels=32, feat_channels=32)
        for part in ("bbox_roi_extractor", "mask_roi_extractor"):
            m.roi_head[part].out_channels = 32
        for h in heads:
            h.update(in_channels=32, fc_out_channels=64)
            if "conv_out_channels" in h:
                h["conv_out_channels"] = 32
        m.roi_head.mask_head.update(in_channels=32, conv_out_channels=32)
    return m


@pytest.mark.parametrize("config", ALL)
def test_every_recipe_builds_with_our_backbone(config):
    from mmdet.registry import MODELS

    import inline_attn.dense.mm as plugin

    assert "mmdet" in plugin.REGISTERED
    cfg = _model_cfg(config)
    with torch.device("meta"):
        model = MODELS.build(cfg)
    assert type(model.backbone).__name__ == "InLineBackbone"
    assert model.backbone.out_channels == list(cfg.neck.in_channels)


@pytest.mark.parametrize("config", ["mask_rcnn_inline_pvt_tiny_1x.py", "cascade_mask_rcnn_inline_swin_tiny_3x.py"])
def test_one_training_step_and_a_prediction(config):
    """Two 64 x 64 images with boxes and masks: a training step (finite losses of every head) and a
    prediction (boxes and masks per image), on the tiny PVT under both detectors."""
    from mmengine.optim import OptimWrapper
    from mmengine.structures import InstanceData
    from mmdet.registry import MODELS
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks

    model = MODELS.build(_model_cfg(config, tiny=True, num_classes=3))
    g = torch.Generator().manual_seed(0)

    def sample():
        s = DetDataSample(
            metainfo=dict(img_shape=(64, 64), ori_shape=(64, 64), pad_shape=(64, 64), scale_factor=(1.0, 1.0))
        )
        boxes = torch.tensor([[4.0, 6.0, 40.0, 44.0], [30.0, 20.0, 62.0, 60.0]])
        masks = torch.zeros(2, 64, 64, dtype=torch.uint8)
        for k, (x1, y1, x2, y2) in enumerate(boxes.int().tolist()):
            masks[k, y1:y2, x1:x2] = 1
        s.gt_instances = InstanceData(
            bboxes=boxes, labels=torch.randint(0, 3, (2,), generator=g), masks=BitmapMasks(masks.numpy(), 64, 64)
        )
        return s

    data = {
        "inputs": [torch.randint(0, 255, (3, 64, 64), dtype=torch.uint8, generator=g) for _ in range(2)],
        "data_samples": [sample(), sample()],
    }
    optim = OptimWrapper(torch.optim.AdamW(model.parameters(), lr=1e-4))
    model.train()
    log = model.train_step(data, optim)
    assert torch.isfinite(log["loss"])
    assert any("loss_mask" in k for k in log) and any("loss_rpn_cls" in k for k in log)
    model.eval()
    out = model.test_step(data)
    assert len(out) == 2
    for o in out:
        p = o.pred_instances
        assert p.bboxes.shape[-1] == 4 and len(p.scores) == len(p.labels) == len(p.masks)
