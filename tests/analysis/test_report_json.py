"""The analyses' JSON files: written through runtime.report.write_json (atomic; values JSON cannot
hold, such as a data folder given as a path, written as text)."""

from __future__ import annotations

import json
import pathlib

import torch

from inline_attn.analysis import load_models, write_masking
from inline_attn.analysis.common import ImageSet

DEIT = dict(img_size=28, patch_size=7, embed_dim=16, depth=1, num_heads=2, in_chans=1, num_classes=10)


def test_masking_json_takes_a_data_path_and_leaves_no_temporary_file(tmp_path):
    models = load_models(["inline_deit_tiny"], model_args=DEIT)
    images = ImageSet(torch.randint(0, 256, (2, 1, 28, 28), dtype=torch.uint8), torch.tensor([0, 1]), "random")
    data = pathlib.Path("/datasets/fmnist")
    out = tmp_path / "mask"
    write_masking(models, images, out, ks=(3,), progress=False, data=data, layers=(0,))
    meta = json.loads((out / "masking.json").read_text())
    assert meta["data"] == str(data) and meta["layers"] == [0] and meta["images"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["masking.csv", "masking.json", "masking.md", "masking.png"]
