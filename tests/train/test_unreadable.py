"""The one mechanism for unreadable files (inline_attn.data.unreadable) that the classification
folders, ADE20K and COCO share: stand in with the next readable sample, log each bad file once,
fail clearly when none is readable; the datasets holding it stay picklable (loader workers
started by spawn receive a pickled copy)."""

from __future__ import annotations

import logging
import pickle

import pytest

from inline_attn.data import ImageFolder
from inline_attn.data.unreadable import UnreadableFiles, decode_image

from train_helpers import make_folder


def test_substitute_wraps_around_and_logs_each_bad_sample_once(caplog):
    files = UnreadableFiles(4, lambda i: f"file{i}", "a set")

    def load(i):
        if i in (3, 0):
            raise OSError(f"broken {i}")
        return i

    with caplog.at_level(logging.WARNING, logger="inline_attn.data.unreadable"):
        assert files.substitute(3, load) == 1  # 3 and 0 are bad: wraps to 1
        assert files.substitute(0, load) == 1
        assert files.substitute(2, load) == 2
    assert files.bad == {0, 3}
    assert [r.getMessage() for r in caplog.records] == [
        "unreadable file3 (OSError: broken 3)",
        "unreadable file0 (OSError: broken 0)",
    ]
    with pytest.raises(ValueError, match=r"no readable sample in a set \(4 unreadable\)"):
        UnreadableFiles(4, str, "a set").substitute(1, lambda i: 1 / 0)


def test_decode_image_names_the_file(tmp_path):
    bad = tmp_path / "x.png"
    bad.write_bytes(b"")
    with pytest.raises(ValueError, match=rf"cannot decode label file {bad} \(UnidentifiedImageError"):
        decode_image(bad, "label file")


def test_image_folder_stays_picklable_and_substitutes_through_a_copy(tmp_path):
    root = make_folder(tmp_path / "d", per_class=2)
    (root / "train" / "cat" / "0.png").write_bytes(b"not a png")
    ds = pickle.loads(pickle.dumps(ImageFolder(root / "train", 16, train=True)))
    x, y = ds[0]
    assert y == 0 and ds.unreadable.bad == {0} and ds.unreadable.name(0).endswith("0.png")
