"""COCO-format export of the Fashion-MNIST mosaics (instances: boxes and masks), a reader of COCO
``instances_*.json`` files with their image folder, and box AP through pycocotools.

Masks are stored as uncompressed RLE (``{"size": [h, w], "counts": [...]}``, column-major runs
starting with background), which pycocotools reads as is; boxes as ``[x, y, width, height]``.
Category ids 1..10 are the Fashion-MNIST classes (the semantic label values; 0 = background is
not a category).
"""

from __future__ import annotations

import json
import pathlib
from typing import Optional

import numpy as np

from ..._io import atomic_write_text, read_json
from ...data.unreadable import UnreadableFiles, decode_image
from ...runtime.progress import progress_bar
from .mosaic import MOSAIC_CLASSES, FashionMosaics
from ...data.subset import subset_size

__all__ = [
    "CocoDetection",
    "check_detections",
    "check_has_objects",
    "check_instances",
    "coco_box_ap",
    "mask_to_rle",
    "mosaics_to_coco",
    "read_instances",
    "rle_to_mask",
    "to_coco_detections",
    "write_coco",
]


def mask_to_rle(mask) -> dict:
    """bool mask [H, W] -> uncompressed COCO RLE (column-major run lengths, first run = zeros)."""
    m = np.asarray(mask, dtype=bool)
    flat = m.flatten(order="F").astype(np.uint8)
    change = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    runs = np.diff(bounds).tolist()
    if flat.size and flat[0] == 1:
        runs = [0] + runs
    return {"size": [int(m.shape[0]), int(m.shape[1])], "counts": [int(r) for r in runs]}


def rle_to_mask(rle: dict) -> np.ndarray:
    """Uncompressed COCO RLE -> bool mask [H, W]."""
    h, w = rle["size"]
    counts = rle["counts"]
    if sum(counts) != h * w:
        raise ValueError(f"RLE counts sum to {sum(counts)}, expected {h}x{w} = {h * w}")
    vals = np.zeros(len(counts), dtype=bool)
    vals[1::2] = True
    return np.repeat(vals, counts).reshape((w, h)).T


def mosaics_to_coco(
    dataset: FashionMosaics,
    *,
    file_pattern: str = "{split}_{index:06d}.png",
    indices: Optional[range] = None,
    progress: bool = False,
) -> dict:
    """The COCO instances dict of ``dataset`` (image ids = mosaic index + 1; annotation ids from 1)."""
    images, anns = [], []
    size = dataset.spec.size
    for i in progress_bar(
        indices if indices is not None else range(len(dataset)), desc="COCO export", progress=progress, leave=False
    ):
        s = dataset[i]
        images.append(
            {"id": i + 1, "file_name": file_pattern.format(split=dataset.split, index=i), "height": size, "width": size}
        )
        for box, cls, mask in zip(s["boxes"].tolist(), s["classes"].tolist(), s["masks"]):
            x1, y1, x2, y2 = box
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": i + 1,
                    "category_id": int(cls),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": int(mask.sum()),
                    "iscrowd": 0,
                    "segmentation": mask_to_rle(mask.numpy()),
                }
            )
    return {
        "info": {
            "description": f"Fashion-MNIST mosaics ({dataset.split}, seed {dataset.seed})",
            "mosaic_spec": dataset.spec.to_dict(),
        },
        "images": images,
        "annotations": anns,
        "categories": [{"id": k, "name": n, "supercategory": "garment"} for k, n in enumerate(MOSAIC_CLASSES) if k],
    }


def write_coco(dataset: FashionMosaics, out_dir, *, write_images: bool = True, progress: bool = False) -> pathlib.Path:
    """Write ``out_dir/annotations/instances_<split>.json`` and (with ``write_images``) the
    mosaics as ``out_dir/images/<split>_<index>.png`` with their semantic label maps as
    ``out_dir/labels/<split>_<index>.png``. Returns the JSON path."""
    from PIL import Image

    out = pathlib.Path(out_dir)
    coco = mosaics_to_coco(dataset, progress=progress)
    if write_images:
        (out / "images").mkdir(parents=True, exist_ok=True)
        (out / "labels").mkdir(parents=True, exist_ok=True)
        for img in coco["images"]:
            s = dataset[img["id"] - 1]
            Image.fromarray(s["image"].permute(1, 2, 0).numpy()).save(out / "images" / img["file_name"])
            Image.fromarray(s["label"].numpy()).save(out / "labels" / img["file_name"])
    path = out / "annotations" / f"instances_{dataset.split}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(coco))
    return path


# ---- reading COCO instances files and box AP through pycocotools ------------------------------


# The keys each record must have: those the reader uses (``READ_KEYS``) and those pycocotools'
# COCOeval reads (``EVAL_KEYS``); a missing one would otherwise surface as a bare KeyError.
READ_KEYS = {
    "images": ("id", "file_name", "height", "width"),
    "annotations": ("id", "image_id", "category_id", "bbox"),
    "categories": ("id", "name"),
}
EVAL_KEYS = {"images": ("id",), "annotations": ("id", "image_id", "category_id", "bbox", "area"), "categories": ("id",)}


def _finite(values) -> bool:
    try:
        return bool(np.isfinite(np.asarray(values, dtype=np.float64)).all())
    except (TypeError, ValueError):  # not numbers at all
        return False


def check_instances(coco: dict, where: str = "COCO file", keys: dict = READ_KEYS) -> dict:
    """ValueError unless ``coco`` has images, annotations and categories lists whose records have
    ``keys`` (default: what :class:`CocoDetection` reads) and unique ids, images have positive
    ``height`` / ``width``, and every annotation names a known image and category with a finite
    box ``[x, y, w, h]`` of w, h >= 0. The error names the file (``where``), the record and the
    key. Returns ``coco``."""
    _check_records(coco, where, keys)
    _check_references(coco, where)
    return coco


def _check_records(coco, where: str, keys: dict) -> None:
    """The three lists exist; their records are objects with ``keys`` and unique ids; images have
    positive sizes."""
    if not isinstance(coco, dict):
        raise ValueError(f"{where}: not a JSON object (is it a COCO instances_*.json?)")
    for key in ("images", "annotations", "categories"):
        if not isinstance(coco.get(key), list):
            raise ValueError(f"{where}: no {key!r} list (is it a COCO instances_*.json?)")
    for section, need in keys.items():
        seen = set()
        for i, rec in enumerate(coco[section]):
            name = f"{where}: {section}[{i}]" + (
                f" (id {rec['id']!r})" if isinstance(rec, dict) and "id" in rec else ""
            )
            if not isinstance(rec, dict):
                raise ValueError(f"{name} is {type(rec).__name__}, expected an object")
            missing = [k for k in need if k not in rec]
            if missing:
                raise ValueError(f"{name} has no {', '.join(map(repr, missing))} (keys: {sorted(rec)})")
            if "id" in rec:
                if rec["id"] in seen:
                    raise ValueError(f"{name}: id {rec['id']!r} appears twice in {section}")
                seen.add(rec["id"])
    for i, im in enumerate(coco["images"]):
        for k in ("height", "width"):
            if k in im and not (isinstance(im[k], (int, float)) and _finite(im[k]) and im[k] > 0):
                raise ValueError(f"{where}: images[{i}] (id {im.get('id')!r}) has {k}={im[k]!r}, expected > 0")


def _check_references(coco: dict, where: str) -> None:
    """Annotations name known images and categories and have finite, non-negative boxes."""
    cats = {c["id"] for c in coco["categories"]}
    imgs = {im["id"] for im in coco["images"]}
    unknown = sorted({a["category_id"] for a in coco["annotations"]} - cats)
    if unknown:
        raise ValueError(
            f"{where}: annotations use category ids {unknown[:10]} not among its {len(cats)} categories "
            f"{sorted(cats)[:10]}{'...' if len(cats) > 10 else ''}"
        )
    missing = sorted({a["image_id"] for a in coco["annotations"]} - imgs)
    if missing:
        raise ValueError(f"{where}: annotations refer to image ids {missing[:10]} absent from its images")
    bad = [
        a["id"]
        for a in coco["annotations"]
        if not (isinstance(a["bbox"], (list, tuple)) and len(a["bbox"]) == 4 and _finite(a["bbox"]))
        or a["bbox"][2] < 0
        or a["bbox"][3] < 0
    ]
    if bad:
        raise ValueError(
            f"{where}: annotations {bad[:10]} ({len(bad)} in all) have a bbox that is not "
            "[x, y, w >= 0, h >= 0] of finite numbers"
        )


def read_instances(path) -> dict:
    """A COCO ``instances_*.json`` (checked by :func:`check_instances`)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"COCO annotation file {path} does not exist")
    return check_instances(read_json(path), str(path))


AP_KEYS = ("AP", "AP50", "AP75", "APs", "APm", "APl")


def check_detections(detections: list[dict]) -> None:
    """ValueError unless every detection has ``image_id``, ``category_id``, a finite ``bbox``
    ``[x, y, w, h]`` and a finite ``score``. The error gives how many fail and the first few
    (their index in ``detections`` and image id): pycocotools would score a NaN box as a hit."""
    need = ("image_id", "category_id", "bbox", "score")
    for i, d in enumerate(detections):
        missing = [k for k in need if k not in d]
        if missing:
            raise ValueError(f"detection {i} has no {', '.join(map(repr, missing))} (keys: {sorted(d)})")
    bad = [
        i
        for i, d in enumerate(detections)
        if not (isinstance(d["bbox"], (list, tuple)) and len(d["bbox"]) == 4 and _finite(d["bbox"]))
        or not _finite(d["score"])
    ]
    if bad:
        first = ", ".join(f"#{i} (image {detections[i]['image_id']})" for i in bad[:5])
        raise ValueError(
            f"{len(bad)} of {len(detections)} detections have a non-finite (NaN / inf) or malformed box or score: "
            f"{first}{', ...' if len(bad) > 5 else ''}; the model diverged, or the boxes were scaled by a zero size"
        )


def coco_box_ap(gt: dict, detections: list[dict]) -> dict:
    """COCO box AP (pycocotools' COCOeval, iouType "bbox"), in percent.

    gt: a COCO instances dict; detections: ``{"image_id", "category_id", "bbox": [x, y, w, h],
    "score"}`` each. Returns AP (IoU 0.5:0.95), AP50, AP75, APs, APm, APl; a size range without
    ground truth gives -1 (pycocotools' value for "undefined"); no detections give AP 0.
    A NaN or infinite box or score, in a detection or the ground truth, is a ValueError (naming
    how many and which): pycocotools itself would count a NaN box as a perfect hit.
    """
    import contextlib
    import copy
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    check_instances(gt, "ground truth", EVAL_KEYS)
    check_detections(detections)
    cats, imgs = {c["id"] for c in gt["categories"]}, {im["id"] for im in gt["images"]}
    bad_cat = sorted({d["category_id"] for d in detections} - cats)
    bad_img = sorted({d["image_id"] for d in detections} - imgs)
    if bad_cat or bad_img:
        raise ValueError(
            f"detections name unknown category ids {bad_cat[:10]} / image ids {bad_img[:10]} of the ground truth"
        )
    if not detections:
        return {k: 0.0 for k in AP_KEYS}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        coco_gt = COCO()
        coco_gt.dataset = copy.deepcopy(gt)
        coco_gt.createIndex()
        coco_dt = coco_gt.loadRes([dict(d) for d in detections])
        ev = COCOeval(coco_gt, coco_dt, "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return {k: (float(v) * 100 if v >= 0 else -1.0) for k, v in zip(AP_KEYS, ev.stats[:6])}


def _is_target(ann: dict) -> bool:
    """Whether an annotation is a training target: not a crowd, a box of positive width and height."""
    return not ann.get("iscrowd", 0) and ann["bbox"][2] > 0 and ann["bbox"][3] > 0


def check_has_objects(ds: CocoDetection, ann_file, training: bool) -> None:
    """ValueError, naming ``ann_file`` and its image count, unless ``ds`` holds an object
    (:meth:`CocoDetection.objects`): a training set without one teaches only background, and a
    validation set without one has no AP (pycocotools gives -1, "undefined")."""
    if ds.objects(training):
        return
    what = "training target (not crowd, a box of width and height > 0)" if training else "non-crowd object"
    n_file = len(ds.coco["images"])
    images = f"its {n_file} images" if len(ds) == n_file else f"the first {len(ds)} of its {n_file} images"
    raise ValueError(
        f"the {'training' if training else 'validation'} annotation file {ann_file} holds no {what} in {images} "
        f"({len(ds.coco['annotations'])} annotations in all): "
        + ("training would learn only background" if training else "box AP is undefined without ground truth")
    )


def to_coco_detections(result: dict, image_id: int, cat_ids, scale: float = 1.0) -> list[dict]:
    """One image's detections (``boxes`` [D, 4] xyxy, ``scores``, ``labels`` 0..K-1 of the
    model's input, which is the image resized by ``scale``) -> COCO result entries."""
    out = []
    for (x1, y1, x2, y2), s, c in zip(
        (result["boxes"] / scale).tolist(), result["scores"].tolist(), result["labels"].tolist()
    ):
        out.append(
            {
                "image_id": int(image_id),
                "category_id": int(cat_ids[c]),
                "bbox": [x1, y1, x2 - x1, y2 - y1],
                "score": float(s),
            }
        )
    return out


class CocoDetection:
    """A COCO-layout detection set: ``instances_*.json`` + its image folder.

    Categories map to contiguous labels 0..K-1 in order of id (``cat_ids[label]`` is the id).
    Each image is resized (bilinear) by ``scale = min(short_size / short side, max_size / long
    side)`` (mmdet's ``Resize(scale=(1333, 800), keep_ratio=True)``); boxes likewise. Crowd
    annotations and boxes of zero width or height are not training targets (they stay in the
    ground truth for evaluation, as COCOeval treats them).

    ``ds[i]`` / ``ds[(i, seed)]`` (flipped left-right with probability ``flip``): (image float
    [3, h, w] 0-255, ``{"boxes" [N, 4] xyxy, "labels" [N]}``).

    An image that is missing, cannot be decoded, or whose size differs from the JSON's
    ``width`` / ``height`` is a ValueError naming the file in evaluation (``ds[i]``); a training
    item (``ds[(i, seed)]``) logs it once, counts it and takes the next usable image
    (:mod:`inline_attn.data.unreadable`). A size mismatch is refused, not corrected: the boxes are
    in the pixels the JSON describes, so the JSON and the folder disagree about the image.

    ``subset``: the first N images in order of id (``data.val_subset``; 0: all; more than the
    file holds is a ValueError naming both numbers).
    """

    def __init__(
        self,
        ann_file,
        image_dir,
        *,
        short_size: int = 800,
        max_size: int = 1333,
        flip: float = 0.0,
        subset: int = 0,
    ):
        for name, v in (("short_size", short_size), ("max_size", max_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r}: expected a whole number of pixels >= 1")
        self.coco = read_instances(ann_file)
        self.image_dir = pathlib.Path(image_dir)
        if not self.image_dir.is_dir():
            raise ValueError(f"COCO image folder {self.image_dir} does not exist")
        self.cat_ids = sorted(c["id"] for c in self.coco["categories"])
        names = {c["id"]: c["name"] for c in self.coco["categories"]}
        self.classes = tuple(names[c] for c in self.cat_ids)
        self.num_classes = len(self.cat_ids)
        self._label = {c: i for i, c in enumerate(self.cat_ids)}
        images = sorted(self.coco["images"], key=lambda im: im["id"])
        self.images = images[: subset_size(subset, len(images), f"the annotation file {ann_file}")]
        self._anns: dict[int, list] = {}
        for a in self.coco["annotations"]:
            self._anns.setdefault(a["image_id"], []).append(a)
        self.short_size, self.max_size, self.flip = short_size, max_size, flip
        self.unreadable = UnreadableFiles(len(self.images), self.describe, str(self.image_dir))

    def __len__(self) -> int:
        return len(self.images)

    def image_id(self, index: int) -> int:
        return int(self.images[index]["id"])

    def scale(self, index: int) -> float:
        im = self.images[index]
        h, w = im["height"], im["width"]
        return min(self.short_size / min(h, w), self.max_size / max(h, w))

    def coco_gt(self) -> dict:
        return self.coco

    def objects(self, training: bool) -> int:
        """How many annotations of this set's images count: for ``training`` the targets (not
        crowd, a box of positive width and height), else those COCOeval scores (not crowd)."""
        return sum(
            1
            for im in self.images
            for a in self._anns.get(im["id"], [])
            if (_is_target(a) if training else not a.get("iscrowd", 0))
        )

    def describe(self, index: int) -> str:
        return f"COCO image {self.image_dir / self.images[index]['file_name']}"

    def read(self, index: int) -> np.ndarray:
        """Image ``index`` as RGB uint8 [H, W, 3] at its JSON size, or a ValueError naming the file."""
        im = self.images[index]
        path = self.image_dir / im["file_name"]
        if not path.is_file():
            raise ValueError(f"image {im['file_name']} (id {im['id']}) not found in {self.image_dir}")
        img = np.asarray(decode_image(path, f"image (id {im['id']})").convert("RGB"))
        if img.shape[:2] != (im["height"], im["width"]):
            raise ValueError(
                f"image {path} (id {im['id']}) is {img.shape[1]}x{img.shape[0]} (width x height) but its annotation "
                f"file says {im['width']}x{im['height']}: the boxes would be scaled wrongly; fix the JSON's width / "
                "height or point it at the images it was made for"
            )
        return img

    def __getitem__(self, item):
        import torch
        import torch.nn.functional as F

        index, seed = item if isinstance(item, tuple) else (item, None)
        if seed is None:  # evaluation: stop, naming the file
            pixels = self.read(index)
        else:  # training: an unusable image is logged, counted and replaced by the next usable one
            index, pixels = self.unreadable.substitute(index, lambda j: (j, self.read(j)))
        im = self.images[index]
        img = torch.from_numpy(pixels.astype(np.float32)).permute(2, 0, 1)
        s = self.scale(index)
        size = (max(1, round(img.shape[1] * s)), max(1, round(img.shape[2] * s)))
        img = F.interpolate(img[None], size=size, mode="bilinear", align_corners=False)[0]
        anns = [a for a in self._anns.get(im["id"], []) if _is_target(a)]
        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]
        boxes *= s
        labels = torch.tensor([self._label[a["category_id"]] for a in anns], dtype=torch.long)
        if seed is not None and self.flip > 0 and np.random.default_rng(seed).random() < self.flip:
            from .transforms import flip_boxes

            img, boxes = img.flip(-1), flip_boxes(boxes, img.shape[-1])
        return img, {"boxes": boxes, "labels": labels}
