"""COCO box AP through pycocotools: ground truth fed back scores 100, a hand-made case its known
AP; the instances reader and its errors; the mosaics' export evaluates end to end."""

from __future__ import annotations

import json
import pathlib
import pickle
import re
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("pycocotools")  # in the test extra

from inline_attn.dense.data.coco import CocoDetection, coco_box_ap, read_instances, to_coco_detections  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "train"))
from train_helpers import make_fmnist  # noqa: E402


def _gt(boxes_per_image, cats=(1, 2)):
    images, anns = [], []
    for i, boxes in enumerate(boxes_per_image, start=1):
        images.append({"id": i, "file_name": f"{i}.png", "height": 100, "width": 100})
        for cat, (x, y, w, h) in boxes:
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": i,
                    "category_id": cat,
                    "bbox": [x, y, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
    return {"images": images, "annotations": anns, "categories": [{"id": c, "name": f"c{c}"} for c in cats]}


def test_ground_truth_as_predictions_scores_100():
    gt = _gt([[(1, (10, 10, 20, 30)), (2, (50, 40, 35, 30))], [(1, (5, 5, 60, 70))]])
    dets = [
        {"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0}
        for a in gt["annotations"]
    ]
    res = coco_box_ap(gt, dets)
    assert (
        res["AP"] == pytest.approx(100.0)
        and res["AP50"] == pytest.approx(100.0)
        and res["AP75"] == pytest.approx(100.0)
    )


def test_hand_made_case_known_ap():
    """One class, two objects; detections by score: hit, false positive, hit. Precision 1, 1/2,
    2/3 at recall 1/2, 1/2, 1. COCO's interpolated precision at its 101 recall points: 1 for the
    51 points r <= 0.5, 2/3 for the 50 above, at every IoU threshold (the hits are exact):
    AP = (51 + 50 * 2/3) / 101."""
    gt = _gt([[(1, (10, 10, 20, 20)), (1, (60, 60, 20, 20))]])
    dets = [
        {"image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "score": 0.9},
        {"image_id": 1, "category_id": 1, "bbox": [35, 5, 10, 10], "score": 0.8},
        {"image_id": 1, "category_id": 1, "bbox": [60, 60, 20, 20], "score": 0.7},
    ]
    expected = 100 * (51 + 50 * 2 / 3) / 101
    res = coco_box_ap(gt, dets)
    assert res["AP"] == pytest.approx(expected, abs=1e-6)
    assert res["APs"] == pytest.approx(expected, abs=1e-6) and res["APl"] == -1.0  # 400 px boxes are small
    # a detection shifted to IoU 0.6 counts at thresholds 0.5 and 0.55 only: AP50 stays, AP75 and AP fall
    dets[2]["bbox"] = [60, 60, 20, 12]  # IoU 240 / 400 = 0.6
    res = coco_box_ap(gt, dets)
    assert res["AP50"] == pytest.approx(expected, abs=1e-6)
    assert res["AP75"] == pytest.approx(100 * 51 / 101, abs=1e-6)  # one hit: precision 1 up to recall 1/2


def test_no_detections_and_unknown_ids():
    gt = _gt([[(1, (10, 10, 20, 20))]])
    assert coco_box_ap(gt, [])["AP"] == 0.0
    with pytest.raises(ValueError, match=r"unknown category ids \[7\]"):
        coco_box_ap(gt, [{"image_id": 1, "category_id": 7, "bbox": [0, 0, 5, 5], "score": 1.0}])
    with pytest.raises(ValueError, match=r"image ids \[9\]"):
        coco_box_ap(gt, [{"image_id": 9, "category_id": 1, "bbox": [0, 0, 5, 5], "score": 1.0}])


def test_reader_errors(tmp_path):
    bad = _gt([[(5, (10, 10, 20, 20))]])
    (tmp_path / "a.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"category ids \[5\] not among its 2 categories"):
        read_instances(tmp_path / "a.json")
    (tmp_path / "b.json").write_text(json.dumps({"images": []}))
    with pytest.raises(ValueError, match="no 'annotations'"):
        read_instances(tmp_path / "b.json")
    with pytest.raises(ValueError, match="does not exist"):
        read_instances(tmp_path / "missing.json")
    neg = _gt([[(1, (10, 10, -2, 20))]])
    (tmp_path / "c.json").write_text(json.dumps(neg))
    with pytest.raises(ValueError, match="w >= 0"):
        read_instances(tmp_path / "c.json")


def test_coco_folder_reader(tmp_path):
    """Images are resized (short side to ``short_size``), boxes with them; crowd and empty boxes
    are no training targets; labels follow the category ids' order."""
    from PIL import Image

    (tmp_path / "img").mkdir()
    Image.fromarray(np.full((50, 100, 3), 200, np.uint8)).save(tmp_path / "img" / "1.png")
    gt = _gt([[(2, (10, 10, 20, 30)), (1, (0, 0, 0, 10))]], cats=(2, 1))
    gt["images"][0].update(height=50, width=100)
    gt["annotations"].append({"id": 9, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5], "area": 25, "iscrowd": 1})
    (tmp_path / "ann.json").write_text(json.dumps(gt))
    ds = CocoDetection(tmp_path / "ann.json", tmp_path / "img", short_size=100, max_size=300)
    assert ds.cat_ids == [1, 2] and ds.num_classes == 2 and ds.scale(0) == 2.0
    img, t = ds[0]
    assert img.shape == (3, 100, 200)
    assert t["boxes"].tolist() == [[20.0, 20.0, 60.0, 80.0]] and t["labels"].tolist() == [1]
    # detections map back to the original image's pixels and ids
    dets = to_coco_detections(
        {"boxes": torch.tensor([[20.0, 20.0, 60.0, 80.0]]), "scores": torch.tensor([0.5]), "labels": torch.tensor([1])},
        ds.image_id(0),
        ds.cat_ids,
        ds.scale(0),
    )
    assert dets == [{"image_id": 1, "category_id": 2, "bbox": [10.0, 10.0, 20.0, 30.0], "score": 0.5}]
    with pytest.raises(ValueError, match="does not exist"):
        CocoDetection(tmp_path / "ann.json", tmp_path / "nope")


def test_mosaic_ground_truth_through_the_dataset_scores_100(tmp_path):
    """The detection view of the mosaics (labels, ids, export) is consistent: its own targets
    turned into detections score AP 100 against its COCO export."""
    from inline_attn.dense.data.mosaic_sets import MosaicDet
    from inline_attn.dense.data.mosaic import FashionMosaics

    root = make_fmnist(tmp_path, n_train=20, n_test=10)
    ds = MosaicDet(FashionMosaics("val", 6, root=root), flip=0.0)
    dets = []
    for i in range(len(ds)):
        _, t = ds[i]
        r = {"boxes": t["boxes"], "labels": t["labels"], "scores": torch.ones(len(t["labels"]))}
        dets += to_coco_detections(r, ds.image_id(i), ds.cat_ids)
    assert coco_box_ap(ds.coco_gt(), dets)["AP"] == pytest.approx(100.0)


@pytest.mark.parametrize(
    "bad",
    [[float("nan")] * 4, [10.0, 10.0, float("inf"), 20.0], [10.0, 10.0, 20.0]],
    ids=["nan-box", "inf-width", "three-numbers"],
)
def test_non_finite_detection_boxes_are_refused(bad):
    """pycocotools alone scores one NaN box against one ground-truth box as AP 100."""
    gt = _gt([[(1, (10, 10, 20, 20))], [(1, (5, 5, 10, 10))]])
    good = {"image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "score": 0.9}
    with pytest.raises(ValueError, match=r"1 of 2 detections have a non-finite .* #1 \(image 2\)"):
        coco_box_ap(gt, [good, {"image_id": 2, "category_id": 1, "bbox": bad, "score": 0.5}])


def test_non_finite_scores_and_missing_detection_keys_are_refused():
    gt = _gt([[(1, (10, 10, 20, 20))]])
    with pytest.raises(ValueError, match=r"1 of 1 detections .* #0 \(image 1\)"):
        coco_box_ap(gt, [{"image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "score": float("nan")}])
    with pytest.raises(ValueError, match=r"detection 0 has no 'score'"):
        coco_box_ap(gt, [{"image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20]}])


def test_non_finite_or_incomplete_ground_truth_is_refused():
    gt = _gt([[(1, (10, 10, 20, 20)), (1, (30, 30, 5, 5))]])
    gt["annotations"][1]["bbox"][2] = float("nan")
    with pytest.raises(ValueError, match=r"annotations \[2\] \(1 in all\) have a bbox .* finite"):
        coco_box_ap(gt, [])
    gt = _gt([[(1, (10, 10, 20, 20))]])
    del gt["annotations"][0]["area"]  # COCOeval reads it for the size ranges
    with pytest.raises(ValueError, match=r"ground truth: annotations\[0\] \(id 1\) has no 'area'"):
        coco_box_ap(gt, [])


@pytest.mark.parametrize(
    "section,key",
    [
        ("annotations", "bbox"),
        ("annotations", "category_id"),
        ("annotations", "image_id"),
        ("images", "file_name"),
        ("images", "height"),
        ("images", "width"),
        ("categories", "name"),
    ],
)
def test_reader_names_a_missing_key_and_its_record(tmp_path, section, key):
    gt = _gt([[(1, (10, 10, 20, 20)), (2, (30, 30, 5, 5))]])
    del gt[section][-1][key]
    (tmp_path / "a.json").write_text(json.dumps(gt))
    with pytest.raises(ValueError, match=rf"a\.json: {section}\[{len(gt[section]) - 1}\] \(id \d+\) has no '{key}'"):
        read_instances(tmp_path / "a.json")


def test_reader_refuses_bad_sizes_and_duplicate_ids(tmp_path):
    gt = _gt([[(1, (10, 10, 20, 20))], []])
    gt["images"][1]["height"] = 0
    (tmp_path / "a.json").write_text(json.dumps(gt))
    with pytest.raises(ValueError, match=r"images\[1\] \(id 2\) has height=0, expected > 0"):
        read_instances(tmp_path / "a.json")
    gt = _gt([[(1, (10, 10, 20, 20))], []])
    gt["images"][1]["id"] = 1
    (tmp_path / "b.json").write_text(json.dumps(gt))
    with pytest.raises(ValueError, match=r"id 1 appears twice in images"):
        read_instances(tmp_path / "b.json")


def _coco_folder(tmp_path, n=3, cats=(1, 2)):
    """n 40x60 PNG images, one box each, and their instances JSON: (json path, image folder)."""
    from PIL import Image

    (tmp_path / "img").mkdir(exist_ok=True)
    gt = _gt([[(cats[i % len(cats)], (5, 5, 10, 10))] for i in range(n)], cats=cats)
    for im in gt["images"]:
        im.update(height=40, width=60)
        Image.fromarray(np.full((40, 60, 3), 10 * im["id"], np.uint8)).save(tmp_path / "img" / im["file_name"])
    ann = tmp_path / f"ann{len(cats)}.json"
    ann.write_text(json.dumps(gt))
    return ann, tmp_path / "img"


@pytest.mark.parametrize("how", ["truncated", "zero-byte", "garbage", "wrong-size"])
def test_unusable_image_is_skipped_in_training_and_named_in_evaluation(tmp_path, caplog, how):
    """Truncated, empty, garbage, or of another size than the JSON says (the boxes are in the
    JSON's pixels, so a mismatch is refused rather than trusted or corrected)."""
    from PIL import Image

    ann, img_dir = _coco_folder(tmp_path)
    victim = img_dir / "2.png"
    if how == "wrong-size":
        Image.fromarray(np.zeros((30, 60, 3), np.uint8)).save(victim)
    else:
        data = victim.read_bytes()
        victim.write_bytes({"truncated": data[: len(data) // 2], "zero-byte": b"", "garbage": b"no png" * 50}[how])
    ds = CocoDetection(ann, img_dir, short_size=40, max_size=100)
    assert pickle.loads(pickle.dumps(ds)).unreadable.name(1) == f"COCO image {victim}"  # spawned loader workers
    message = (
        r"is 60x30 \(width x height\) but its annotation file says 60x40" if how == "wrong-size" else "cannot decode"
    )
    with pytest.raises(ValueError) as err:
        ds[1]
    assert str(victim) in str(err.value) and re.search(message, str(err.value)), str(err.value)
    with caplog.at_level("WARNING", logger="inline_attn.data.unreadable"):
        img, t = ds[(1, 5)]
        ds[(1, 6)]
    want_img, want_t = ds[2]  # image 3 and its own box stand in
    torch.testing.assert_close((img, t), (want_img, want_t))
    assert ds.unreadable.bad == {1}
    warned = [r.getMessage() for r in caplog.records if str(victim) in r.getMessage()]
    assert len(warned) == 1, caplog.records


def test_validation_categories_must_match_training(tmp_path):
    from inline_attn.dense.config import DetConfig
    from inline_attn.dense.data.loading import build_det_datasets

    train_ann, img_dir = _coco_folder(tmp_path, cats=(1, 2, 3))
    val_ann, _ = _coco_folder(tmp_path, cats=(1, 2))
    over = [("data.dataset", "coco")] + [
        (f"data.coco.{k}", str(v))
        for k, v in (("train_ann", train_ann), ("train_images", img_dir), ("val_ann", val_ann), ("val_images", img_dir))
    ]
    with pytest.raises(
        ValueError,
        match=r"ann2.json have 2 categories, the training ones .*ann3.json 3: .*only in "
        r"training \[3\]",
    ):
        build_det_datasets(DetConfig.load(overrides=over))
    tr, va = build_det_datasets(
        DetConfig.load(
            overrides=[*over[:-2], ("data.coco.val_ann", str(train_ann)), ("data.coco.val_images", str(img_dir))]
        )
    )
    assert tr.cat_ids == va.cat_ids == [1, 2, 3]
    # the validation file must also hold what COCOeval reads: told before training, not at the first evaluation
    gt = json.loads(train_ann.read_text())
    del gt["annotations"][0]["area"]
    val_ann.write_text(json.dumps(gt))
    with pytest.raises(ValueError, match=r"ann2.json: annotations\[0\] \(id 1\) has no 'area'"):
        build_det_datasets(DetConfig.load(overrides=over))


@pytest.mark.parametrize("key,value", [("short_size", 0), ("max_size", -5), ("short_size", 2.5)])
def test_reader_refuses_a_non_positive_size(tmp_path, key, value):
    """--data.coco.short_size 0 used to scale every box by 0: NaN detections, AP 53."""
    ann, img_dir = _coco_folder(tmp_path)
    with pytest.raises(ValueError, match=rf"{key}={value}: expected a whole number of pixels >= 1"):
        CocoDetection(ann, img_dir, **{key: value})


def _coco_overrides(train_ann, val_ann, img_dir, *extra):
    return [("data.dataset", "coco"), *extra] + [
        (f"data.coco.{k}", str(v))
        for k, v in (("train_ann", train_ann), ("train_images", img_dir), ("val_ann", val_ann), ("val_images", img_dir))
    ]


def test_val_subset_takes_the_first_images_and_refuses_more_than_the_file_holds(tmp_path):
    """data.val_subset is the first N images by id; asking for more than the file holds is refused."""
    from inline_attn.dense.config import DetConfig
    from inline_attn.dense.data.loading import build_det_datasets

    ann, img_dir = _coco_folder(tmp_path)
    _, va = build_det_datasets(DetConfig.load(overrides=_coco_overrides(ann, ann, img_dir, ("data.val_subset", 2))))
    assert [va.image_id(i) for i in range(len(va))] == [1, 2]
    with pytest.raises(ValueError, match=rf"data.val_subset=5 asks for the first 5 .*{re.escape(str(ann))} holds 3"):
        build_det_datasets(DetConfig.load(overrides=_coco_overrides(ann, ann, img_dir, ("data.val_subset", 5))))


@pytest.mark.parametrize("which", ["train", "val"])
@pytest.mark.parametrize("how", ["no annotations", "crowd only", "none in the subset"])
def test_annotation_file_without_objects_is_refused(tmp_path, which, how):
    """A validation file without objects scored box AP -1 as a result; a training one trained on
    background only. Both are refused before training, naming the file and its image count."""
    from inline_attn.dense.config import DetConfig
    from inline_attn.dense.data.loading import build_det_datasets

    good, img_dir = _coco_folder(tmp_path)
    gt = json.loads(good.read_text())
    if how == "no annotations":
        gt["annotations"] = []
    elif how == "crowd only":
        for a in gt["annotations"]:
            a["iscrowd"] = 1
    else:  # the first two images (data.val_subset 2) hold none
        gt["annotations"] = [a for a in gt["annotations"] if a["image_id"] == 3]
    bad = tmp_path / "empty.json"
    bad.write_text(json.dumps(gt))
    subset = [("data.val_subset", 2)] if how == "none in the subset" else []
    train_ann, val_ann = (bad, good) if which == "train" else (good, bad)
    over = _coco_overrides(train_ann, val_ann, img_dir, *subset)
    if which == "train" and subset:  # the subset is of the validation images only: training has an object
        assert len(build_det_datasets(DetConfig.load(overrides=over))[0]) == 3
        return
    images = "the first 2 of its 3 images" if subset else "its 3 images"
    kind = "training" if which == "train" else "validation"
    with pytest.raises(ValueError, match=rf"the {kind} annotation file {re.escape(str(bad))} holds no .* in {images}"):
        build_det_datasets(DetConfig.load(overrides=over))
    if which == "val":  # det eval builds only the validation set: refused there too
        with pytest.raises(ValueError, match=rf"{re.escape(str(bad))} holds no non-crowd object"):
            build_det_datasets(DetConfig.load(overrides=over), train=False)
