"""Pictures of segmentation data and predictions (matplotlib, Agg), and the files of the
``seg mosaics`` command (:func:`export_mosaics`: a COCO folder and / or a picture of mosaics)."""

from __future__ import annotations

import pathlib
from typing import Optional, Sequence

import numpy as np
import torch

from .._io import save_figure
from .data.coco import write_coco
from .data.mosaic import FashionMosaics

__all__ = ["colorize", "export_mosaics", "palette", "save_detections", "save_mosaic_samples", "save_predictions"]


def palette(num_classes: int) -> np.ndarray:
    """[K, 3] uint8 colours: black for class 0, then well-separated hues (tab20's)."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    cols = [(0, 0, 0)] + [tuple(int(255 * c) for c in cmap(i % 20)[:3]) for i in range(num_classes - 1)]
    return np.array(cols, dtype=np.uint8)


def colorize(label: torch.Tensor, num_classes: int, ignore_index: int = 255) -> np.ndarray:
    """label map [H, W] -> RGB [H, W, 3] uint8 (ignored pixels white)."""
    lab = label.cpu().numpy().astype(np.int64)
    out = np.full(lab.shape + (3,), 255, np.uint8)
    ok = (lab >= 0) & (lab < num_classes)
    out[ok] = palette(num_classes)[lab[ok]]
    return out


def _img(image: torch.Tensor) -> np.ndarray:
    """uint8 or [0, 1] float image [3, H, W] -> [H, W, 3] uint8."""
    x = image.detach().cpu()
    if x.dtype != torch.uint8:
        x = (x.clamp(0, 1) * 255).round().to(torch.uint8)
    return x.permute(1, 2, 0).numpy()


def _legend(fig, class_names: Sequence[str]) -> None:
    from matplotlib.patches import Patch

    pal = palette(len(class_names))
    handles = [Patch(color=pal[i] / 255, label=n) for i, n in enumerate(class_names)]
    fig.legend(handles=handles, loc="lower center", ncol=min(6, len(handles)), fontsize=7, frameon=False)


def _figure(rows: int, cols: int, width: float, margin: float):
    """(fig, axes [rows][cols]) with matplotlib on Agg: ``width`` inches wide, 2.1 a row plus ``margin``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(rows, cols, figsize=(width, 2.1 * rows + margin), squeeze=False)


def _show_row(axes, pictures, names, *, titled: bool, fontsize: int) -> None:
    """One picture a panel, without ticks; the panel names as titles on the ``titled`` (first) row."""
    for ax, pic, name in zip(axes, pictures, names):
        ax.imshow(pic, interpolation="nearest")
        ax.set_xticks([]), ax.set_yticks([])
        if titled:
            ax.set_title(name, fontsize=fontsize)


def _save(fig, path, title: Optional[str], *, fontsize: int, bottom: float, top: float, dpi: int) -> pathlib.Path:
    """The optional title over ``fig`` (the panels laid out between ``bottom`` and ``top``, or the
    full height without a title), saved as PNG at ``path``; the figure closed."""
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout(rect=(0, bottom, 1, top if title else 1))
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=dpi)
    plt.close(fig)
    return path


def save_predictions(
    images: torch.Tensor,
    labels: torch.Tensor,
    preds: torch.Tensor,
    path,
    class_names: Sequence[str],
    title: Optional[str] = None,
    ignore_index: int = 255,
) -> pathlib.Path:
    """One row per image: the image, its ground truth, the prediction.

    images: [N, 3, H, W] uint8 (or float in [0, 1]); labels, preds: [N, H, W] class indices
    (or lists of per-image tensors of different sizes).
    """
    n, k = len(images), len(class_names)
    fig, axes = _figure(n, 3, 6.3, 0.6)
    for i in range(n):
        _show_row(
            axes[i],
            (_img(images[i]), colorize(labels[i], k, ignore_index), colorize(preds[i], k, ignore_index)),
            ("image", "ground truth", "prediction"),
            titled=i == 0,
            fontsize=9,
        )
    return _finish(fig, class_names, title, path)


def save_mosaic_samples(dataset, path, n: int = 4, title: Optional[str] = None) -> pathlib.Path:
    """One row per mosaic of ``dataset`` (a :class:`FashionMosaics`): image, semantic labels,
    instance masks with their boxes and class names."""
    names = dataset.classes
    k = len(names)
    fig, axes = _figure(n, 3, 6.3, 0.6)
    for i in range(n):
        s = dataset[i]
        inst = np.zeros(s["label"].shape + (3,), np.uint8)
        pal = palette(max(len(s["masks"]) + 1, 2))
        for j, m in enumerate(s["masks"]):
            inst[m.numpy()] = pal[j + 1]
        _show_row(
            axes[i],
            (_img(s["image"]), colorize(s["label"], k), inst),
            ("mosaic", "semantic labels", "instances"),
            titled=i == 0,
            fontsize=9,
        )
        _draw_boxes(axes[i][2], s["boxes"], s["classes"], names, color="w", lw=0.8)
    return _finish(fig, names, title, path)


def _finish(fig, class_names, title: Optional[str], path) -> pathlib.Path:
    """The class legend and the optional title under / over ``fig``, saved as PNG at ``path``."""
    _legend(fig, class_names)
    return _save(fig, path, title, fontsize=9, bottom=0.06, top=0.97, dpi=110)


def _draw_boxes(ax, boxes, labels, names, scores=None, *, color=None, lw: float = 1.0) -> None:
    """Each box [x1, y1, x2, y2] in pixels with its class name (and score) above it, in the
    class's palette colour or ``color``."""
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Rectangle

    pal = palette(len(names) + 1)
    for j, (box, c) in enumerate(zip(boxes.tolist(), labels.tolist())):
        x1, y1, x2, y2 = box
        col = pal[c + 1] / 255 if color is None else color
        ax.add_patch(Rectangle((x1 - 0.5, y1 - 0.5), x2 - x1, y2 - y1, fill=False, color=col, lw=lw))
        text = names[c] if scores is None else f"{names[c]} {scores[j]:.2f}"
        # dark or light text on the box's colour, whichever contrasts: legible on any background
        ink = "black" if float(np.dot(to_rgb(col), (0.299, 0.587, 0.114))) > 0.55 else "white"
        ax.text(
            x1,
            y1 - 1,
            text,
            color=ink,
            fontsize=7,
            va="bottom",
            bbox=dict(facecolor=col, alpha=0.9, edgecolor="none", pad=0.6),
        )


def save_detections(
    images, targets, results, path, class_names: Sequence[str], *, score_threshold: float = 0.3, title=None
) -> pathlib.Path:
    """One row per image: its ground-truth boxes, then the detections scoring at least
    ``score_threshold`` with their scores; where boxes of several classes overlap (IoU > 0.5) only
    the best-scoring one is drawn, so labels stay legible (the evaluation keeps them all).
    images: [3, H, W] each (uint8, or float 0-255); targets / results: dicts with ``boxes`` xyxy
    and ``labels`` 0..K-1 (results: ``scores``)."""
    from .models.boxes import nms

    n = len(images)
    fig, axes = _figure(n, 2, 4.4, 0.5)
    names = ("ground truth", f"detections (score >= {score_threshold}, best per place)")
    for i in range(n):
        img = images[i] if images[i].dtype == torch.uint8 else images[i].clamp(0, 255).round().to(torch.uint8)
        r = results[i]
        keep = torch.nonzero(r["scores"] >= score_threshold).squeeze(1)
        keep = keep[nms(r["boxes"][keep], r["scores"][keep], 0.5)]
        _show_row(axes[i], (_img(img), _img(img)), names, titled=i == 0, fontsize=8)
        _draw_boxes(axes[i][0], targets[i]["boxes"], targets[i]["labels"], class_names)
        _draw_boxes(axes[i][1], r["boxes"][keep], r["labels"][keep], class_names, r["scores"][keep].tolist())
    return _save(fig, path, title, fontsize=8, bottom=0.0, top=0.96, dpi=130)


def export_mosaics(
    mosaics: FashionMosaics, *, coco=None, png=None, rows: Optional[int] = None, progress: bool = True
) -> dict[str, pathlib.Path]:
    """Write ``mosaics`` as a COCO-format folder under ``coco``
    (:func:`~inline_attn.dense.data.coco.write_coco`) and/or a PNG of the first ``rows`` mosaics
    (default 4, at most all of them) to ``png``; returns {"coco": instances JSON, "png": PNG} of
    those written. ``rows`` without ``png``, or more rows than mosaics, is refused."""
    if not coco and not png:
        raise ValueError("nothing to do: give --coco DIR and/or --png FILE")
    if rows is not None and not png:
        raise ValueError(f"--rows {rows} sets the rows of the --png FILE: give --png, or no --rows")
    if rows is not None and not 1 <= rows <= len(mosaics):
        raise ValueError(f"--rows {rows}: expected 1 to {len(mosaics)} (the number of mosaics)")
    out = {}
    if coco:
        out["coco"] = write_coco(mosaics, coco, progress=progress)
    if png:
        out["png"] = save_mosaic_samples(mosaics, png, n=min(4, len(mosaics)) if rows is None else rows)
    return out
