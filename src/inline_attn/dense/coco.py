"""COCO-format export of the Fashion-MNIST mosaics (instances: boxes and masks), for detection.

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

from .mosaic import MOSAIC_CLASSES, FashionMosaics

__all__ = ["mask_to_rle", "mosaics_to_coco", "rle_to_mask", "write_coco"]


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
    from tqdm import tqdm

    images, anns = [], []
    size = dataset.spec.size
    for i in tqdm(
        indices if indices is not None else range(len(dataset)), desc="COCO export", disable=not progress, leave=False
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
    path.write_text(json.dumps(coco))
    return path
