"""profile(): MACs counted from the computation agree with analytic counts and the paper's table."""

from __future__ import annotations

import json

import pytest

from inline_attn import create_model, get_model_config, profile
from inline_attn.cli import main
from inline_attn.models.deit import InLineDeiT
from inline_attn.models.pvt import InLinePVT


def deit_macs(img, p, c_in, dim, depth, heads, mlp_ratio, classes, kind="inline"):
    """Analytic multiply-adds of one image through our DeiT (batch 1)."""
    n = (img // p) ** 2
    t = n + 1  # tokens incl. cls
    hidden = int(dim * mlp_ratio)
    block = t * dim * 3 * dim + t * dim * dim + 2 * t * dim * hidden  # qkv, proj, mlp
    if kind == "inline":
        block += 2 * t * dim * (dim // heads)  # per head: K^T V and Q (K^T V), d x d each
        block += dim * (dim // heads) + 9 * dim * (dim // heads)  # residual predictor (grouped 1x1 convs)
        block += 9 * n * dim  # the 3x3 local residual on patch tokens
    else:
        block += 2 * t * t * dim  # Q K^T and A V
    return n * dim * c_in * p * p + depth * block + dim * classes


def pvt_macs(img, dims, heads, ratios, depths, srs, pattern, classes):
    total, side, c_in = 0, img, 3
    for i, (c, h, r, dep, sr, kind) in enumerate(zip(dims, heads, ratios, depths, srs, pattern)):
        p = 4 if i == 0 else 2
        side //= p
        n = side * side
        total += n * c * c_in * p * p  # patch embedding
        block = n * c * c + 2 * n * c * int(c * r)  # proj, mlp
        if kind == "I":
            block += n * c * c + n * c * 2 * c  # q, kv
            block += 2 * n * c * (c // h) + 10 * c * (c // h) + 9 * n * c
        else:
            m = (side // sr) ** 2
            block += n * c * c + (n * c * c if sr > 1 else 0) + m * c * 2 * c  # q, sr conv, kv
            block += 2 * n * m * c  # Q K^T and A V
        total += dep * block
        c_in = c
    return total + dims[-1] * classes


@pytest.mark.parametrize("kind", ["inline", "softmax"])
def test_deit_macs_match_analytic_count(kind):
    args = dict(img=32, p=4, c_in=3, dim=24, depth=2, heads=2, mlp_ratio=4.0, classes=10)
    model = InLineDeiT(
        img_size=32,
        patch_size=4,
        embed_dim=24,
        depth=2,
        num_heads=2,
        num_classes=10,
        pattern="I" if kind == "inline" else "S",
    )
    res = profile(model, (3, 32, 32))
    assert res.macs == deit_macs(**args, kind=kind)
    assert res.params == sum(p.numel() for p in model.parameters())


def test_pvt_macs_match_analytic_count():
    cfg = dict(
        dims=(8, 16, 24, 32),
        heads=(1, 2, 3, 4),
        ratios=(2, 2, 2, 2),
        depths=(1, 2, 1, 1),
        srs=(8, 4, 2, 1),
        pattern="ISIS",
    )
    model = InLinePVT(
        img_size=64,
        embed_dims=cfg["dims"],
        num_heads=cfg["heads"],
        mlp_ratios=cfg["ratios"],
        depths=cfg["depths"],
        sr_ratios=cfg["srs"],
        pattern=cfg["pattern"],
        num_classes=10,
    )
    assert profile(model, (3, 64, 64)).macs == pvt_macs(64, classes=10, **cfg)


def test_batch_scales_macs_and_training_flag_is_restored():
    model = InLineDeiT(img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=2, num_classes=5).train()
    one, three = profile(model, (3, 32, 32)), profile(model, (3, 32, 32), batch_size=3)
    assert three.macs == 3 * one.macs and three.gmacs == one.gmacs
    assert model.training


@pytest.mark.parametrize("name", ["inline_deit_tiny", "inline_pvt_tiny"])
def test_published_macs_within_one_percent_of_spec(name):
    # the smallest published model of each family at its published size (the others: see docs)
    cfg = get_model_config(name)
    res = profile(create_model(name), cfg.input_size)
    assert res.params == cfg.num_params
    assert abs(res.gmacs / cfg.macs_g - 1) < 0.01, f"{name}: {res.gmacs:.4f} G vs the paper's {cfg.macs_g} G"


def test_bad_input_size_raises():
    model = InLineDeiT(img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=2)
    with pytest.raises(ValueError, match="input_size"):
        profile(model, (32, 32))


def test_cli_info_reports_params_and_macs(capsys):
    assert main(["info", "inline_deit_tiny", "--img-size", "32", "32", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["params"] == 6_477_736 and info["profiled_input_size"] == [3, 32, 32]
    assert info["macs"] > 0 and info["config"]["paper_top1"] == 74.5
    assert main(["info", "inline_pvt_tiny", "--no-macs"]) == 0
    assert "12,032,232" in capsys.readouterr().out
    assert main(["info", "inline_nope"]) == 2
    assert "unknown model" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["inline_deit_tiny", "--no-macs", "--img-size", "32", "32"],
            "--img-size 32 32 is the size the MACs are counted",
        ),
        (["inline_deit_tiny", "--img-size", "0", "32"], "--img-size 0 32: expected two positive sizes H W"),
        (["configs/ade20k/semantic_fpn_inline_pvt_tiny.yaml", "--img-size", "64", "64"], "profiled at its crop size"),
    ],
    ids=["img-size-without-macs", "img-size-0", "img-size-of-a-config"],
)
def test_cli_info_refuses_a_size_it_would_not_use(capsys, argv, message):
    """Issue 36: --img-size was ignored with --no-macs and for a segmentation config."""
    assert main(["info", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inline-attn: error: ") and message in err, err


def test_cli_info_at_a_size_beyond_memory_names_the_size(capsys):
    """A 12 TB input used to end in the CPU allocator's raw traceback."""
    assert main(["info", "inline_deit_tiny", "--img-size", "1000000", "1000000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inline-attn: error: counting the MACs at input 1x3x1000000x1000000 ran out of cpu memory")
    assert "count them at a smaller input size" in err and "Traceback" not in err
