"""A YAML config refuses what PyYAML would resolve silently: a key given twice in one mapping (the
last one won: a duplicated ``optim:`` section trained at another learning rate) and a null section
(``optim:`` with no keys, or ``optim: null``, reset every key to its default)."""

from __future__ import annotations

import pytest

from inline_attn.dense.config import SegConfig
from inline_attn.train.config import Config


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "optim:\n  lr: 0.1\nsched:\n  epochs: 2\noptim:\n  lr: 0.625\n",
            r"line 5, column 1: the key 'optim' is given twice",
        ),
        ("optim:\n  lr: 0.1\n  lr: 0.2\n", r"line 3, column 3: the key 'lr' is given twice"),
        ("model:\n  kwargs: {depth: 2, depth: 3}\n", r"the key 'depth' is given twice"),
        ("optim: {lr: 0.1, lr: 0.1}\n", r"the key 'lr' is given twice"),  # even with one value
        ("optim: null\n", r"config section 'optim' is null"),
        ("optim:\nsched: {epochs: 3}\n", r"config section 'optim' is null"),
        ("optim: ~\n", r"config section 'optim' is null"),
    ],
)
def test_a_duplicate_key_or_a_null_section_is_refused_naming_it(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        Config.load(path)


def test_a_duplicate_in_a_base_file_is_named_with_that_file(tmp_path):
    (tmp_path / "base.yaml").write_text("sched: {epochs: 1}\nsched: {epochs: 2}\n")
    (tmp_path / "c.yaml").write_text("_base_: base.yaml\noptim: {lr: 0.1}\n")
    with pytest.raises(ValueError, match=r"base.yaml: YAML syntax error at line 2.*'sched' is given twice"):
        Config.load(tmp_path / "c.yaml")


def test_a_null_nested_section_of_a_dense_config_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  mosaic: null\n")
    with pytest.raises(ValueError, match=r"config section 'data.mosaic' is null"):
        SegConfig.load(path)


def test_neighbours_load(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 0.1\n  clip_grad: null\nsched:\n  epochs: 20\nmodel:\n  checkpoint: null\n")
    cfg = Config.load(path)  # a null setting (not a section) is a value; distinct keys are fine
    assert cfg.optim.lr == 0.1 and cfg.optim.clip_grad is None and cfg.sched.epochs == 20
    assert Config.load(path, [("optim.lr", 0.2)]).optim.lr == 0.2  # an override is no duplicate
