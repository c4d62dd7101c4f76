"""The dense modules' old names still import (issue 24 renamed and split them): ``dense.engine`` is
``dense.seg_task`` and ``dense.det_engine`` is ``dense.det_task``, the same module objects, so a
monkeypatch through an old name reaches the code that runs; ``dense.data`` still gives every name
it had before ``dense.ade20k`` and ``dense.mosaic_sets`` took its datasets."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import torch

from inline_attn.dense.config import DetConfig, SegConfig

ALIASES = [("engine", "seg_task"), ("det_engine", "det_task")]


@pytest.mark.parametrize("old, new", ALIASES)
def test_an_old_task_module_name_is_the_new_module(old, new):
    old_module = importlib.import_module(f"inline_attn.dense.{old}")
    new_module = importlib.import_module(f"inline_attn.dense.{new}")
    assert old_module is new_module
    # the package attribute too: ``from inline_attn.dense import engine``
    assert getattr(importlib.import_module("inline_attn.dense"), old) is new_module


def test_a_monkeypatch_through_an_old_name_reaches_the_new_module(monkeypatch):
    from inline_attn.dense import det_engine, det_task, engine, seg_task

    built = []
    monkeypatch.setattr(engine, "build_segmentor", lambda **kw: built.append("seg") or torch.nn.Linear(1, 1))
    monkeypatch.setattr(det_engine, "build_detector", lambda **kw: built.append("det") or torch.nn.Linear(1, 1))
    seg_task.build_from_config(SegConfig(), 150)
    det_task.build_det_from_config(DetConfig(), 10)
    assert built == ["seg", "det"]


def test_the_old_names_import_first_in_a_fresh_process():
    code = (
        "import sys\n"
        "from inline_attn.dense.engine import SegTask, train_seg\n"
        "from inline_attn.dense.det_engine import DetTask, train_det\n"
        "import inline_attn.dense.seg_task as s, inline_attn.dense.det_task as d\n"
        "assert SegTask is s.SegTask and DetTask is d.DetTask\n"
        "assert sys.modules['inline_attn.dense.engine'] is s and sys.modules['inline_attn.dense.det_engine'] is d\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# every name the single dense/data.py had (its __all__, then the rest), and where each lives now
OLD_DATA_NAMES = {
    "ADE20K": "ade20k",
    "ADE20K_CLASSES": "ade20k",
    "MosaicDet": "mosaic_sets",
    "MosaicSeg": "mosaic_sets",
    "StepSampler": "data",
    "build_det_datasets": "data",
    "build_seg_datasets": "data",
    "collate": "data",
    "det_collate": "data",
    "check_same_categories": "data",
    "ADE_LAYOUT": "ade20k",
    "PathLike": "ade20k",
    "_ADE_SPLITS": "ade20k",
    "_IMG_EXT": "ade20k",
    "_SegPipeline": "ade20k",
    "_to_tensors": "ade20k",
    "_render_all": "mosaic_sets",
}


def test_the_old_data_module_gives_every_name_it_had():
    from inline_attn.dense import data, mosaic_sets

    for name, home in OLD_DATA_NAMES.items():
        assert getattr(data, name) is getattr(importlib.import_module(f"inline_attn.dense.{home}"), name), name
    assert data._mosaic_sets is mosaic_sets.build_mosaic_sets  # renamed when it became public
    with pytest.raises(AttributeError, match="inline_attn.dense.data' has no attribute 'nothing'"):
        data.nothing
