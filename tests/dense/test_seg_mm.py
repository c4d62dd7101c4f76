"""The mmsegmentation plugin: runs only where mmseg (with mmcv's ops) imports; the outcome of a
run with mmseg installed is recorded in docs/dense.md."""

from __future__ import annotations

import pathlib

import pytest
import torch

pytest.importorskip("mmseg.models", reason="mmsegmentation / mmcv (the optional mm extra) not installed")

from mmengine.config import Config  # noqa: E402

CONFIGS = pathlib.Path(__file__).parents[2] / "configs" / "ade20k" / "mm"
TINY_PVT = dict(
    embed_dims=(16, 16, 32, 32), num_heads=(1, 1, 2, 2), mlp_ratios=(2, 2, 2, 2), depths=(1, 1, 1, 1), img_size=64
)


def _model_cfg(name: str, num_classes: int = 150, tiny: bool = False):
    from mmseg.utils import register_all_modules

    register_all_modules()
    cfg = Config.fromfile(str(CONFIGS / name))  # custom_imports loads inline_attn.dense.mm
    m = cfg.model
    for head in ("decode_head", "auxiliary_head"):
        if head in m:
            m[head]["norm_cfg"] = dict(type="BN", requires_grad=True)  # SyncBN needs a process group
            m[head]["num_classes"] = num_classes
    if tiny:
        m.backbone.update(TINY_PVT)
        m.data_preprocessor["size"] = (64, 64)
        if "neck" in m:
            m.neck.in_channels = [16, 16, 32, 32]
        else:
            m.decode_head.in_channels = [16, 16, 32, 32]
            m.auxiliary_head.in_channels = 32
    return m


@pytest.mark.parametrize(
    "config,params",
    [
        ("semantic_fpn_inline_pvt_tiny.py", 15_785_878),
        ("upernet_inline_swin_tiny.py", 60_877_052),
    ],
)
def test_mmseg_models_have_our_parameter_counts(config, params):
    from mmseg.registry import MODELS

    import inline_attn.dense.mm as plugin

    assert "mmseg" in plugin.REGISTERED
    model = MODELS.build(_model_cfg(config))
    n = sum(p.numel() for p in model.parameters())
    print(f"{config}: mmseg {n:,}")
    assert n == params


@pytest.mark.parametrize("config", ["semantic_fpn_inline_pvt_tiny.py", "upernet_inline_swin_tiny.py"])
def test_one_training_step_and_a_prediction(config):
    from mmengine.optim import OptimWrapper
    from mmengine.structures import PixelData
    from mmseg.registry import MODELS
    from mmseg.structures import SegDataSample

    cfg = _model_cfg(config, num_classes=5, tiny=True)
    cfg.backbone.name = "inline_pvt_tiny"  # the tiny PVT under both heads keeps the test fast
    model = MODELS.build(cfg)
    g = torch.Generator().manual_seed(0)

    def sample():
        s = SegDataSample(metainfo=dict(img_shape=(64, 64), ori_shape=(64, 64), pad_shape=(64, 64)))
        s.gt_sem_seg = PixelData(data=torch.randint(0, 5, (1, 64, 64), generator=g))
        return s

    data = {
        "inputs": [torch.randint(0, 255, (3, 64, 64), dtype=torch.uint8, generator=g) for _ in range(2)],
        "data_samples": [sample(), sample()],
    }
    optim = OptimWrapper(torch.optim.AdamW(model.parameters(), lr=1e-3))
    model.train()
    log = model.train_step(data, optim)
    assert torch.isfinite(log["loss"]) and "decode.loss_ce" in log
    model.eval()
    out = model.test_step(data)
    assert len(out) == 2 and out[0].pred_sem_seg.data.shape == (1, 64, 64)
    assert int(out[0].pred_sem_seg.data.max()) < 5
