"""ADE20K reader and mmseg's training pipeline on a tiny synthetic folder with the exact layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from inline_attn.dense.config import SegConfig
from inline_attn.dense.data.ade20k import ADE20K, ADE20K_CLASSES
from inline_attn.dense.data.loading import StepSampler, build_seg_datasets
from inline_attn.dense.data.transforms import pad_to, photometric_distortion, random_crop, rescale_size

from seg_helpers import make_ade


def test_classes():
    assert len(ADE20K_CLASSES) == 150 and len(set(ADE20K_CLASSES)) == 150


def test_reader_reduces_zero_label(tmp_path):
    make_ade(tmp_path)
    ds = ADE20K(tmp_path, "val")  # the parent of ADEChallengeData2016 works too
    assert len(ds) == 2
    img, lab = ds.read(1)
    assert img.shape == (48, 40, 3) and img.dtype == np.uint8 and lab.shape == (48, 40)
    # raw: top half class 2, bottom-left 150, bottom-right 0 ("other")
    assert (lab[:24] == 1).all() and (lab[24:, :20] == 149).all() and (lab[24:, 20:] == 255).all()
    raw = ADE20K(tmp_path / "ADEChallengeData2016", "val", reduce_zero_label=False)
    with pytest.raises(ValueError, match=r"values \[150\] outside the classes \(0..149"):
        raw.read(1)


def test_eval_items_resize_image_keep_labels(tmp_path):
    make_ade(tmp_path)
    cfg = SegConfig.load(overrides=[("data.path", str(tmp_path)), ("data.scale", [64, 32])])
    _, val = build_seg_datasets(cfg, train=False)
    img, lab = val[0]
    assert img.shape == (3, 32, 45) and img.dtype == torch.float32  # 40x56 -> short side 32 (aspect kept)
    assert lab.shape == (40, 56) and lab.dtype == torch.int64


def test_training_items(tmp_path):
    make_ade(tmp_path)
    cfg = SegConfig.load(
        overrides=[("data.path", str(tmp_path)), ("data.scale", [128, 32]), ("data.crop_size", [24, 24])]
    )
    train, _ = build_seg_datasets(cfg)
    img, lab = train[(0, 123)]
    assert img.shape == (3, 24, 24) and lab.shape == (24, 24)
    img2, lab2 = train[(0, 123)]
    assert torch.equal(img, img2) and torch.equal(lab, lab2)  # a function of the seed
    assert set(lab.unique().tolist()) <= {0, 149, 255}
    # an image smaller than the crop is padded: image with the mean colour, labels with 255
    cfg = SegConfig.load(
        overrides=[
            ("data.path", str(tmp_path)),
            ("data.scale", [32, 16]),
            ("data.ratio_range", [1.0, 1.0]),
            ("data.crop_size", [40, 40]),
            ("data.photometric", False),
        ]
    )
    train, _ = build_seg_datasets(cfg)
    img, lab = train[(2, 5)]  # 36x36 -> 16x16, padded to 40x40
    assert img.shape == (3, 40, 40) and (lab[16:] == 255).all() and (lab[:, 16:] == 255).all()
    mean = torch.tensor(cfg.data.mean).view(3, 1)
    assert torch.allclose(img[:, 20:, 20:].reshape(3, -1), mean.expand(3, 400))


def test_missing_split_names_layout(tmp_path):
    import shutil

    make_ade(tmp_path)
    shutil.rmtree(tmp_path / "ADEChallengeData2016" / "images" / "validation")
    with pytest.raises(ValueError, match=r"has no images/validation/ \(split 'val'\); expected the layout"):
        ADE20K(tmp_path, "val")
    ADE20K(tmp_path, "train")


def test_missing_label_file(tmp_path):
    make_ade(tmp_path)
    ann = tmp_path / "ADEChallengeData2016" / "annotations" / "training"
    victim = sorted(ann.iterdir())[0]
    victim.unlink()
    with pytest.raises(ValueError, match=f"has no label file .*{victim.name}"):
        ADE20K(tmp_path, "train")


def test_size_mismatch_and_bad_values(tmp_path):
    make_ade(tmp_path)
    ann = sorted((tmp_path / "ADEChallengeData2016" / "annotations" / "training").iterdir())
    Image.fromarray(np.zeros((10, 10), np.uint8)).save(ann[0])
    Image.fromarray(np.full((48, 40), 200, np.uint8)).save(ann[1])
    ds = ADE20K(tmp_path, "train")
    with pytest.raises(ValueError, match=f"labels {ann[0]} are 10x10"):
        ds.read(0)
    with pytest.raises(ValueError, match=rf"{ann[1]} holds values \[200\]"):
        ds.read(1)
    Image.fromarray(np.zeros((48, 40, 3), np.uint8)).save(ann[1])
    with pytest.raises(ValueError, match="single-channel"):
        ds.read(1)


def test_missing_path_names_layout():
    cfg = SegConfig.load()
    with pytest.raises(ValueError, match="ADEChallengeData2016/"):
        build_seg_datasets(cfg)


def test_rescale_size_is_mmcv_keep_ratio():
    # mmcv: factor = min(long / max(h, w), short / min(h, w)), then int(x * f + 0.5)
    assert rescale_size(512, 683, (2048, 512)) == (512, 683)
    assert rescale_size(300, 400, (2048, 512)) == (512, 683)
    assert rescale_size(100, 1000, (2048, 512)) == (205, 2048)


def test_cat_max_ratio_rejects_single_class_windows():
    rng = np.random.default_rng(0)
    img = np.zeros((64, 64, 3), np.float32)
    lab = np.zeros((64, 64), np.uint8)
    lab[:, 56:] = 1  # class 1 only in a thin strip at the right
    hits = 0
    for seed in range(20):
        _, cl = random_crop(img, lab, np.random.default_rng(seed), (16, 16), cat_max_ratio=0.75)
        vals, counts = np.unique(cl, return_counts=True)
        hits += len(vals) > 1 and counts.max() / counts.sum() < 0.75
    _, cl = random_crop(img, lab, rng, (16, 16), cat_max_ratio=1.0)
    assert cl.shape == (16, 16)
    # without the rule, a 16-wide window straddles the strip with probability ~0.3 (and < 0.75 of
    # one class much less); with 10 tries most crops must satisfy it
    assert hits >= 10


def test_photometric_distortion_range_and_determinism():
    img = np.random.default_rng(0).uniform(0, 255, (8, 9, 3)).astype(np.float32)
    a = photometric_distortion(img, np.random.default_rng(3))
    b = photometric_distortion(img, np.random.default_rng(3))
    assert a.shape == img.shape and np.array_equal(a, b) and a.min() >= 0 and a.max() <= 255
    assert any(not np.allclose(photometric_distortion(img, np.random.default_rng(s)), img) for s in range(4))


def test_pad_to():
    img, lab = pad_to(np.ones((2, 3, 3), np.float32), np.zeros((2, 3), np.uint8), (4, 4), (1.0, 2.0, 3.0))
    assert img.shape == (4, 4, 3) and (img[2:, :, 2] == 3).all() and (lab[2:] == 255).all() and (lab[:, 3] == 255).all()


def test_step_sampler_is_a_function_of_the_step():
    s = StepSampler(10, 4, seed=1, rank=0, world_size=2)
    t = StepSampler(10, 4, seed=1, rank=1, world_size=2)
    assert s.batch(3) == StepSampler(10, 4, seed=1, rank=0, world_size=2).batch(3)
    first_pass = [i for step in range(2) for smp in (s, t) for i, _ in smp.batch(step)][:10]
    assert sorted(first_pass) == list(range(10))  # one permutation per pass, split over ranks


def _damage(path, how):
    """Make ``path`` unreadable: cut to half its size, emptied, or overwritten by non-image bytes."""
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "zero-byte": b"", "garbage": b"not an image\n" * 20}[how])


@pytest.mark.parametrize("how", ["truncated", "zero-byte", "garbage"])
@pytest.mark.parametrize("which", ["image", "label"])
def test_bad_file_is_skipped_and_counted_in_training_and_named_in_evaluation(tmp_path, caplog, which, how):
    """One bad file (of 3 training / 2 validation pairs) neither crashes an epoch with a raw
    traceback nor is scored silently: training logs it once and takes the next pair; evaluation
    stops with a ValueError naming the file."""
    make_ade(tmp_path)
    base = tmp_path / "ADEChallengeData2016"
    folder = {"image": "images", "label": "annotations"}[which]
    bad_train = sorted((base / folder / "training").iterdir())[1]
    bad_val = sorted((base / folder / "validation").iterdir())[0]
    _damage(bad_train, how)
    _damage(bad_val, how)
    cfg = SegConfig.load(
        overrides=[("data.path", str(tmp_path)), ("data.scale", [64, 32]), ("data.crop_size", [24, 24])]
    )
    train, val = build_seg_datasets(cfg)
    with caplog.at_level("WARNING", logger="inline_attn.data.unreadable"):
        for _ in range(2):  # logged and counted once
            img, lab = train[(1, 7)]
    torch.testing.assert_close((img, lab), train[(2, 7)])  # the next readable pair stands in
    assert train.unreadable.bad == {1}
    warned = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(warned) == 1 and bad_train.name in warned[0], warned
    kind = {"image": "image", "label": "label file"}[which]
    with pytest.raises(ValueError, match=rf"cannot decode {kind} {bad_val}"):
        val[0]
    val[1]  # the other validation pair still reads


def test_no_readable_training_pair_is_an_error(tmp_path):
    make_ade(tmp_path, n_train=2)
    for p in (tmp_path / "ADEChallengeData2016" / "images" / "training").iterdir():
        _damage(p, "zero-byte")
    train = ADE20K(tmp_path, "train")
    with pytest.raises(ValueError, match=r"no readable sample in .*training \(2 unreadable\)"):
        train[(0, 1)]


def test_readers_stay_picklable_for_spawned_loader_workers(tmp_path):
    import pickle

    make_ade(tmp_path)
    ds = ADE20K(tmp_path, "train")
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.describe(1) == ds.describe(1) and copy.unreadable.name(1) == ds.describe(1)


def test_val_subset_takes_the_first_pairs_and_refuses_more_than_the_folder_holds(tmp_path):
    make_ade(tmp_path)
    _, val = build_seg_datasets(SegConfig.load(overrides=[("data.path", str(tmp_path)), ("data.val_subset", 1)]))
    assert [p[0].name for p in val.pairs] == ["ADE_valid_00000000.jpg"]
    cfg = SegConfig.load(overrides=[("data.path", str(tmp_path)), ("data.val_subset", 3)])
    with pytest.raises(
        ValueError, match=r"data.val_subset=3 asks for the first 3 validation images, but .*validation holds 2"
    ):
        build_seg_datasets(cfg, train=False)
