"""Fashion-MNIST mosaics: determinism, split hygiene, labels consistent with instances, COCO export."""

from __future__ import annotations

import json
import sys
import pathlib

import numpy as np
import pytest
import torch

from inline_attn.dense import FashionMosaics, MosaicSpec
from inline_attn.dense.data.coco import mask_to_rle, mosaics_to_coco, rle_to_mask, write_coco

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "train"))
from train_helpers import make_fmnist  # noqa: E402


def _garments(kind: str, n: int):
    yy, xx = np.mgrid[:28, :28]
    if kind == "square":
        g = ((abs(yy - 14) < 10) & (abs(xx - 14) < 10)) * 200
    else:
        g = ((yy - 14) ** 2 + (xx - 14) ** 2 < 100) * 120
    return np.repeat(g[None].astype(np.uint8), n, 0), np.arange(n) % 10


def _ds(split="train", num=6, seed=0, **spec):
    kind = "square" if split == "train" else "disc"
    return FashionMosaics(split, num, MosaicSpec(size=64, **spec), seed=seed, garments=_garments(kind, 20))


def test_deterministic_and_distinct():
    a, b = _ds()[3], _ds()[3]
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert not torch.equal(_ds()[3]["image"], _ds()[4]["image"])
    assert not torch.equal(_ds(seed=1)[3]["image"], a["image"])
    # the same index of the val split is another mosaic
    assert not torch.equal(_ds("val")[3]["label"], a["label"])


def test_labels_masks_boxes_agree():
    ds = _ds(num=12, objects=(2, 4), scale=(1.0, 1.5), min_area=1)
    for i in range(len(ds)):
        s = ds[i]
        lab, masks, boxes, cls = s["label"], s["masks"], s["boxes"], s["classes"]
        assert s["image"].shape == (3, 64, 64) and s["image"].dtype == torch.uint8
        assert lab.shape == (64, 64) and int(lab.max()) <= 10
        assert masks.shape[1:] == (64, 64) and len(masks) == len(boxes) == len(cls) >= 1
        assert (masks.sum(0) <= 1).all()  # visible parts never overlap
        union = masks.any(0)
        assert torch.equal(union, lab > 0)  # min_area 1: every visible garment pixel is an instance
        for m, b, c in zip(masks, boxes.tolist(), cls.tolist()):
            assert (lab[m] == c).all() and 1 <= c <= 10
            ys, xs = torch.nonzero(m, as_tuple=True)
            assert b == [xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1]


def test_small_remnants_are_not_instances():
    ds = _ds(num=20, objects=(4, 4), scale=(1.5, 2.0), min_area=200)
    for i in range(len(ds)):
        s = ds[i]
        assert all(int(m.sum()) >= 200 for m in s["masks"])


def test_validation_mosaics_use_the_test_split_only(tmp_path):
    # train garments: squares of 200; test garments: discs of 120 -> the tinted colour tells
    root = make_fmnist(tmp_path, n_train=20, n_test=10)
    from inline_attn.data.fmnist import load_fashion_mnist

    val = FashionMosaics("val", 3, MosaicSpec(size=64), root=root)
    test = load_fashion_mnist(root, "test")
    assert np.array_equal(val.garments, test.images[:, 0].numpy())
    train = FashionMosaics("train", 3, MosaicSpec(size=64), root=root)
    assert np.array_equal(train.garments, load_fashion_mnist(root, "train").images[:, 0].numpy())
    assert int(val[0]["sources"].max()) < 10  # indices into the 10 test images


def test_spec_errors():
    with pytest.raises(ValueError, match="does not fit"):
        MosaicSpec(size=40, scale=(1.0, 2.0))
    with pytest.raises(ValueError, match="objects"):
        MosaicSpec(objects=(3, 2))
    with pytest.raises(ValueError, match="split"):
        FashionMosaics("test", 2, garments=_garments("disc", 3))


def test_rle_round_trip():
    rng = np.random.default_rng(0)
    for shape in [(5, 7), (64, 64)]:
        m = rng.random(shape) > 0.6
        m[0, 0] = True
        rle = mask_to_rle(m)
        assert sum(rle["counts"]) == m.size and rle["counts"][0] == 0  # first run counts zeros
        assert np.array_equal(rle_to_mask(rle), m)
    rle = mask_to_rle(np.array([[0, 1], [0, 1]], bool))
    assert rle["counts"] == [2, 2]  # column-major: first column zeros, second ones


def test_coco_export(tmp_path):
    ds = _ds(num=4)
    path = write_coco(ds, tmp_path / "coco")
    coco = json.loads(path.read_text())
    assert [c["id"] for c in coco["categories"]] == list(range(1, 11))
    assert len(coco["images"]) == 4 and all(
        (tmp_path / "coco" / "images" / im["file_name"]).is_file() for im in coco["images"]
    )
    n = sum(len(ds[i]["boxes"]) for i in range(4))
    assert len(coco["annotations"]) == n
    a = coco["annotations"][0]
    s = ds[a["image_id"] - 1]
    x, y, w, h = a["bbox"]
    assert [x, y, x + w, y + h] == s["boxes"][0].tolist()
    assert np.array_equal(rle_to_mask(a["segmentation"]), s["masks"][0].numpy()) and a["area"] == int(
        s["masks"][0].sum()
    )
    assert mosaics_to_coco(ds)["annotations"] == coco["annotations"]
    pycocotools = pytest.importorskip("pycocotools.mask")  # optional: the detection extra
    assert np.array_equal(
        pycocotools.decode(pycocotools.frPyObjects(a["segmentation"], 64, 64)).astype(bool), s["masks"][0].numpy()
    )


def test_val_subset_takes_the_first_mosaics_and_refuses_more_than_the_set_holds(tmp_path):
    """data.val_subset above data.mosaic.val drew new validation mosaics (20 scored where the run had 8)."""
    from inline_attn.dense.config import DetConfig, SegConfig
    from inline_attn.dense.data.loading import build_det_datasets, build_seg_datasets

    fm = make_fmnist(tmp_path, n_train=20, n_test=10)
    base = [("data.dataset", "mosaic"), ("data.path", str(fm)), ("data.mosaic.size", 64), ("data.mosaic.val", 3)]
    _, whole = build_seg_datasets(SegConfig.load(overrides=base), train=False)
    _, first = build_seg_datasets(SegConfig.load(overrides=[*base, ("data.val_subset", 2)]), train=False)
    torch.testing.assert_close(first.images, whole.images[:2])
    torch.testing.assert_close(first.labels, whole.labels[:2])
    for cfg, build in ((SegConfig, build_seg_datasets), (DetConfig, build_det_datasets)):
        with pytest.raises(ValueError, match=r"data.val_subset=4 asks for the first 4 .*data.mosaic.val=3\) holds 3"):
            build(cfg.load(overrides=[*base, ("data.val_subset", 4)]), train=False)
