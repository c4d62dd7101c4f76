"""Small fixtures for the dense tests: tiny backbones, synthetic ADE20K folders."""

from __future__ import annotations

import pathlib

import numpy as np
from PIL import Image

# per family: registered name and constructor overrides for a model small enough for CPU tests
TINY = {
    "pvt": (
        "inline_pvt_tiny",
        dict(
            embed_dims=(16, 16, 32, 32),
            num_heads=(1, 1, 2, 2),
            mlp_ratios=(2, 2, 2, 2),
            depths=(1, 1, 1, 1),
            img_size=64,
        ),
    ),
    "swin": (
        "inline_swin_tiny",
        dict(embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2), window_size=8, img_size=64),
    ),
    "cswin": (
        "inline_cswin_tiny",
        dict(
            embed_dim=16,
            depths=(1, 1, 1, 1),
            num_heads=(1, 1, 2, 2),
            img_size=64,
            inline_split_size=(16, 8, 4, 2),
            split_size=(1, 2, 2, 2),
        ),
    ),
    "deit": ("inline_deit_tiny", dict(embed_dim=16, depth=4, num_heads=2, img_size=64)),
}


def make_ade(
    root: pathlib.Path, n_train: int = 3, n_val: int = 2, sizes=((40, 56), (48, 40), (36, 36)), seed: int = 0
) -> pathlib.Path:
    """An ADEChallengeData2016 folder of small JPEG images and PNG labels (values 0..150)."""
    rng = np.random.default_rng(seed)
    base = root / "ADEChallengeData2016"
    for split, n in (("training", n_train), ("validation", n_val)):
        (base / "images" / split).mkdir(parents=True, exist_ok=True)
        (base / "annotations" / split).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            h, w = sizes[i % len(sizes)]
            img = rng.integers(0, 255, (h, w, 3)).astype(np.uint8)
            lab = np.zeros((h, w), np.uint8)
            lab[: h // 2] = 1 + i  # a band of class i (raw, before reduce_zero_label), the rest "other" (0)
            lab[h // 2 :, : w // 2] = 150
            name = f"ADE_{split[:5]}_{i:08d}"
            Image.fromarray(img).save(base / "images" / split / f"{name}.jpg")
            Image.fromarray(lab).save(base / "annotations" / split / f"{name}.png")
    return root
