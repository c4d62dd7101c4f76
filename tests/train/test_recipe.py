"""The recipe's arithmetic as the authors' code does it: lr / warmup_lr / min_lr scaling with the total
batch (accumulation included), the pinned total batch, timm 0.4.12's schedule, EMA decay per total
batch, the no-decay parameter sets per family."""

import math
import pathlib

import pytest
import torch
import torch.nn as nn

from inline_attn.cli import main
from inline_attn.models import create_model
from inline_attn.train.config import Config
from inline_attn.runtime.optim import build_optimizer
from inline_attn.train.task import build_schedule
from inline_attn.runtime.optim import no_decay_names
from inline_attn.train.recipe import accumulation, resolve

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs" / "imagenet"
IMAGENET_TRAIN = 1_281_167


def test_warmup_and_min_lr_scale_with_the_total_batch_and_accumulation():
    ov = [("optim.base_lr", 5.0e-4), ("sched.warmup_lr", 1.0e-6), ("sched.min_lr", 1.0e-5)]
    # 64 per process x 2 processes x 3 micro-batches = 384 images per step: x 0.75
    r = resolve(Config.load(None, ov + [("data.batch_size", 64), ("optim.accum_steps", 3)]), world_size=2)
    assert (r.total_batch, r.accum_steps, r.lr_scale) == (384, 3, 0.75)
    assert (r.lr, r.warmup_lr, r.min_lr) == pytest.approx((3.75e-4, 7.5e-7, 7.5e-6), rel=1e-12)
    # a pinned total batch: the same values on 8 processes x 128 and on 2 x 128 accumulating 4 micro-batches
    pinned = ov + [("optim.total_batch", 1024), ("data.batch_size", 128)]
    r8, r2 = resolve(Config.load(None, pinned), 8), resolve(Config.load(None, pinned), 2)
    assert (r8.accum_steps, r2.accum_steps) == (1, 4) and r8.total_batch == r2.total_batch == 1024
    assert (r8.lr, r8.warmup_lr, r8.min_lr) == (r2.lr, r2.warmup_lr, r2.min_lr) == pytest.approx((1e-3, 2e-6, 2e-5))
    # optim.lr pins all three as absolute values
    r = resolve(Config.load(None, ov + [("optim.lr", 3.0e-4)]), 4)
    assert (r.lr, r.warmup_lr, r.min_lr, r.lr_scale) == (3.0e-4, 1.0e-6, 1.0e-5, None)


def test_a_total_batch_that_cannot_be_reached_is_refused_with_the_numbers(tmp_path, capsys):
    cfg = Config.load(CONFIGS / "inline_swin_tiny.yaml", [("data.batch_size", 96)])
    with pytest.raises(
        ValueError,
        match=r"optim.total_batch=1024 with data.batch_size=96 x 8 processes "
        r"\(768 images per micro-step\): 1024 / 768 = 1.333 is not a whole "
        r"number .* divides 128 reaches it, e.g. \[32, 64, 128\]",
    ):
        resolve(cfg, 8)
    with pytest.raises(ValueError, match=r"1000 images cannot be split evenly over 3 processes"):
        accumulation(1000, 10, 3)
    with pytest.raises(ValueError, match=r"optim.accum_steps=3 disagrees .* which needs 8 accumulation steps"):
        accumulation(1024, 128, 1, accum_steps=3)
    # from the command line: refused before any data is read (no data.path given) or output written
    out = tmp_path / "run"
    assert (
        main(["train", "-c", str(CONFIGS / "inline_swin_tiny.yaml"), "--data.batch_size", "96", "--output", str(out)])
        == 2
    )
    err = capsys.readouterr().err
    assert "1024 / 96 = 10.67 is not a whole number" in err and not out.exists()


def _schedule(config: str, steps_per_epoch: int):
    cfg = Config.load(CONFIGS / config)
    recipe = resolve(cfg, 8)
    model = nn.Linear(2, 2)
    return build_schedule(cfg, build_optimizer(model, "adamw", recipe.lr, 0.0), recipe, steps_per_epoch)


def test_swin_tiny_schedule_is_timm_0_4_12s_curve():
    """lr 1e-3, warmup_lr 1e-6, min_lr 1e-5 (x 1024/512); 1251 steps per epoch (1,281,167 // 1024);
    T = 300 x 1251 = 375300 cosine steps, T_w = 20 x 1251 = 25020 warm-up steps, no cool-down.
    timm's value after update t: warm-up 1e-6 + t (1e-3 - 1e-6) / 25020; then
    1e-5 + (1e-3 - 1e-5) / 2 x (1 + cos(pi t / 375300)) on the absolute step; step k uses t = k - 1."""
    s = _schedule("inline_swin_tiny.yaml", IMAGENET_TRAIN // 1024)
    assert (s.warmup_steps, s.cosine_steps, s.total_steps) == (25020, 375300, 375300)
    expected = {
        0: 1e-6,  # the warm-up's start, for the first two steps
        1: 1e-6,
        12511: 1e-6 + 12510 * 9.99e-4 / 25020,  # half-way up: 5.005e-4
        25021: 1e-5 + 4.95e-4 * (1 + math.cos(math.pi / 15)),  # t = T_w = T / 15: 9.891829e-4, not 1e-3
        187651: 1e-5 + 4.95e-4,  # t = T / 2: 5.05e-4 (a cosine restarted after the warm-up gives 5.298e-4)
        375301: 1e-5,
    }
    for step, lr in expected.items():
        assert s.lr_at(step) == pytest.approx(lr, rel=1e-12), step
    assert s.lr_at(25021) == pytest.approx(9.891829e-4, rel=1e-6) and s.lr_at(12511) == pytest.approx(5.005e-4)


def test_cswin_base_384_schedule_has_no_warmup_and_ten_epochs_at_min_lr():
    """lr 2.5e-6, min_lr 2.5e-7 (5e-6, 5e-7 x 256/512); 5004 steps per epoch (1,281,167 // 256);
    20 cosine epochs (T = 100080) without warm-up, then 10 at min_lr (150120 steps in all)."""
    s = _schedule("inline_cswin_base_384.yaml", IMAGENET_TRAIN // 256)
    assert (s.warmup_steps, s.cosine_steps, s.total_steps) == (0, 100080, 150120)
    assert s.lr_at(0) == s.lr_at(1) == pytest.approx(2.5e-6, rel=1e-12)
    assert s.lr_at(50041) == pytest.approx(2.5e-7 + 0.5 * 2.25e-6, rel=1e-12)  # t = T / 2: 1.375e-6
    assert s.lr_at(100080) == pytest.approx(2.5e-7 + 1.125e-6 * (1 + math.cos(math.pi * 100079 / 100080)), rel=1e-12)
    assert s.lr_at(100081) == s.lr_at(150119) == pytest.approx(2.5e-7, rel=1e-12)


@pytest.mark.parametrize(
    "config, decay",
    [
        ("inline_cswin_tiny.yaml", 0.9996 ** (1024 / 4096)),  # 0.99990
        ("inline_cswin_small.yaml", 0.9996 ** (1024 / 4096)),
        ("inline_cswin_base.yaml", 0.9996 ** (512 / 4096)),  # 0.99995
        ("inline_cswin_base_384.yaml", 0.9996 ** (256 / 4096)),  # 0.999975
    ],
)
def test_ema_decay_follows_the_total_batch(config, decay):
    cfg = Config.load(CONFIGS / config)
    for world in (8, 2, 1):  # the pinned total batch: the same decay on any number of processes
        assert resolve(cfg, world).ema_decay == pytest.approx(decay, rel=1e-15)
    doubled = Config.load(CONFIGS / config, [("optim.total_batch", 2 * cfg.optim.total_batch)])
    assert resolve(doubled, 8).ema_decay == pytest.approx(decay**2, rel=1e-15)  # half the steps, same horizon
    raw = Config.load(CONFIGS / config, [("train.ema_batch", None)])
    assert resolve(raw, 8).ema_decay == 0.9996
    assert resolve(Config.load(CONFIGS / "inline_swin_tiny.yaml"), 8).ema_decay is None  # no EMA


# the authors' rule (optimizer.py:52-56): 1-d, ".bias", names in no_weight_decay(), substrings of
# no_weight_decay_keywords(); their lists per family (models/inline_*.py)
AUTHORS_SKIP = {
    "deit": ({"pos_embed", "cls_token", "dist_token"}, ()),
    "pvt": ({"cls_token"}, ()),
    "swin": ({"absolute_pos_embed"}, ("relative_position_bias_table",)),
    "cswin": ({"pos_embed", "cls_token"}, ()),
}


@pytest.mark.parametrize("family, count", [("deit", 126), ("pvt", None), ("swin", 130), ("cswin", 270)])
def test_no_decay_parameters_are_the_authors_per_family(family, count):
    cfg = Config.load(CONFIGS / f"inline_{family}_tiny.yaml")
    with torch.device("meta"):
        model = create_model(cfg.model.name)
    skip, keywords = AUTHORS_SKIP[family]
    authors = {
        n
        for n, p in model.named_parameters()
        if len(p.shape) == 1 or n.endswith(".bias") or n in skip or any(k in n for k in keywords)
    }
    ours = set(no_decay_names(model, cfg.optim.no_weight_decay))
    assert ours == authors, (sorted(ours - authors), sorted(authors - ours))
    if count is not None:
        assert len(ours) == count  # the counts the audit found on the authors' models
    if family == "pvt":  # their PVT decays the position embeddings (models/inline_pvt.py:260-262)
        assert not {f"pos_embed{i}" for i in range(1, 5)} & ours
