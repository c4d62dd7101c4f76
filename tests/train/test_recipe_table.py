"""docs/training.md's recipe tables pin every shipped ImageNet config: each value there must be the
value the config resolves to at 8 processes, and a value marked * (the authors' config.py default)
must come from _base.yaml, an unmarked one from the model's own file."""

import pathlib
import re

import pytest
import yaml

from inline_attn.data.crop import eval_size
from inline_attn.models import get_model_config
from inline_attn.train.config import LR_REFERENCE_BATCH, Config
from inline_attn.train.data import data_info
from inline_attn.train.recipe import resolve

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "imagenet"
DOC = ROOT / "docs" / "training.md"
AUTHORS_GPUS = 8


def _table(heading: str) -> dict[str, dict[str, str]]:
    """The markdown table under ``heading``: {config name: {column: cell}}."""
    text = DOC.read_text()
    start = text.index(heading)
    lines = [ln for ln in text[start:].splitlines()[1:]]
    rows = []
    for ln in lines:
        if ln.startswith("|"):
            rows.append([c.strip() for c in ln.strip("|").split("|")])
        elif rows:
            break
    header, body = rows[0], rows[2:]
    return {r[0].strip("`"): dict(zip(header, r)) for r in body}


SCHEDULE = _table("### Batch and schedule")
REGULARISATION = _table("### Regularisation, EMA and evaluation")
SHIPPED = sorted(p.stem for p in CONFIGS.glob("inline_*.yaml"))


def test_the_tables_cover_every_shipped_recipe():
    assert len(SHIPPED) == 15
    assert sorted(SCHEDULE) == sorted(REGULARISATION) == SHIPPED


def _value(cell: str):
    cell = cell.rstrip("*")
    if cell in ("—", "off"):
        return None
    return float(cell)


def _check_source(name: str, key: str, cell: str) -> None:
    """* marks a value the model's file does not set (the authors' config.py default, in _base.yaml)."""
    section, field = key.split(".")
    own = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text()).get(section) or {}
    if cell.endswith("*"):
        assert field not in own, f"{name}: {key} is marked as config.py's default but set in {name}.yaml"
        assert Config.load(CONFIGS / f"{name}.yaml").get(key) == Config.load(CONFIGS / "_base.yaml").get(key)
    else:
        assert field in own, f"{name}: {key} is not marked * but {name}.yaml does not set it"


@pytest.mark.parametrize("name", SHIPPED)
def test_schedule_table_matches_the_resolved_config(name):
    row, cfg = SCHEDULE[name], Config.load(CONFIGS / f"{name}.yaml")
    r = resolve(cfg, AUTHORS_GPUS)
    short = re.fullmatch(r"cfgs/(inline_\w+)\.yaml", row["authors' file"]).group(1)
    assert (CONFIGS / f"{name}.yaml").read_text().count(f"cfgs/{short}.yaml") == 1  # the file names its source
    for col, key in (
        ("per-GPU batch", "data.batch_size"),
        ("epochs", "sched.epochs"),
        ("warm-up", "sched.warmup_epochs"),
        ("cool-down", "sched.cooldown_epochs"),
        ("base_lr", "optim.base_lr"),
        ("warmup_lr", "sched.warmup_lr"),
        ("min_lr", "sched.min_lr"),
    ):
        assert _value(row[col]) == cfg.get(key), (name, col)
        _check_source(name, key, row[col])
    assert r.accum_steps == 1 and r.total_batch == int(row["total batch"]) == AUTHORS_GPUS * cfg.data.batch_size
    for col, got, base in (
        ("lr", r.lr, cfg.optim.base_lr),
        ("warmup_lr (eff.)", r.warmup_lr, cfg.sched.warmup_lr),
        ("min_lr (eff.)", r.min_lr, cfg.sched.min_lr),
    ):
        assert _value(row[col]) == pytest.approx(got, rel=1e-12), (name, col)
        # the authors' scaling (main.py:81-83), computed here from the table's own columns
        assert _value(row[col]) == pytest.approx(base * r.total_batch / LR_REFERENCE_BATCH, rel=1e-12)


@pytest.mark.parametrize("name", SHIPPED)
def test_regularisation_table_matches_the_resolved_config(name):
    row, cfg = REGULARISATION[name], Config.load(CONFIGS / f"{name}.yaml")
    r = resolve(cfg, AUTHORS_GPUS)
    info = data_info(cfg.data, get_model_config(cfg.model.name))
    assert int(row["img"]) == info.img_size
    for col, key in (
        ("weight decay", "optim.weight_decay"),
        ("clip", "optim.clip_grad"),
        ("drop path", "model.drop_path"),
    ):
        assert _value(row[col]) == cfg.get(key), (name, col)
        _check_source(name, key, row[col])
    no_decay = row["no weight decay"]
    # "model": the model's no_weight_decay(); "none": nothing beyond 1-d parameters and biases
    named = {"model": None, "none": ()}.get(no_decay, tuple(no_decay.split(", ")))
    assert cfg.optim.no_weight_decay == named
    if row["EMA decay"] == "—":
        assert r.ema_decay is None and not cfg.train.ema
    else:  # printed to 7 decimals
        assert r.ema_decay == pytest.approx(float(row["EMA decay"]), abs=5e-8)
        assert r.ema_decay == pytest.approx(0.9996 ** (r.total_batch / 4096), rel=1e-15)
    mode, resized, crop = re.fullmatch(r"(\w+) (\d+) → (\d+)", row["eval"]).groups()
    assert (info.eval_resize, eval_size(info.img_size, info.crop_pct), info.img_size) == (mode, int(resized), int(crop))
    init = row["initial weights"]
    assert cfg.model.checkpoint is None  # the user names the file to fine-tune from
    assert cfg.model.checkpoint_ema == init.startswith("EMA of")
    assert (init == "—") == (not name.endswith("_384"))
