"""The dense run machinery: typed configs, resume checks and fallback, signals, the output lock
(regressions of issue 26's segmentation / detection defects)."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal

import pytest
import torch

from inline_attn.dense import seg_task
from inline_attn.dense.config import DetConfig, SegConfig, SegModelCfg
from inline_attn.dense.det_task import DetTask
from inline_attn.dense.seg_task import SegTask, build_from_config
from inline_attn.runtime.run import train
from inline_attn.runtime.checkpoint import LAST, PREVIOUS, load_resume, save_rotating
from inline_attn.runtime.output import OutputLock
from inline_attn.runtime.signals import exit_code
from inline_attn.runtime.optim import build_optimizer

from seg_helpers import make_ade
from test_det_train import make_fmnist, tiny as det_tiny
from test_seg_train import tiny_overrides

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture
def ade(tmp_path):
    return str(make_ade(tmp_path / "ade", n_train=4, n_val=2))


def _seg(out, ade, **extra) -> SegConfig:
    return SegConfig.load(overrides=tiny_overrides(out, **{"data.path": ade, "sched.iters": 2, **extra}))


@pytest.mark.parametrize(
    "path", sorted(p.relative_to(CONFIGS) for d in ("ade20k", "mosaic") for p in (CONFIGS / d).glob("*.yaml"))
)
def test_every_dense_yaml_loads(path):
    load = DetConfig.load if path.name.startswith("det") else SegConfig.load
    cfg = load(CONFIGS / path)
    assert isinstance(cfg, DetConfig if path.name.startswith("det") else SegConfig)
    assert cfg.sched.iters >= 1 and cfg.optim.opt == "adamw"  # the paper's dense recipes: AdamW


@pytest.mark.parametrize(
    "load, key, value, message",
    [
        (SegConfig.load, "optim.clip_grad", -1, "optim.clip_grad=-1.0: must be >= 0"),
        (SegConfig.load, "sched.iters", 2.5, "sched.iters=2.5: expected an integer"),
        (SegConfig.load, "eval.interval", -1, "eval.interval=-1: must be >= 0"),
        (SegConfig.load, "train.log_interval", 0, "train.log_interval=0: must be >= 1"),
        (DetConfig.load, "data.coco.short_size", 0, "data.coco.short_size=0: must be >= 1"),
        (DetConfig.load, "train.log_interval", 0, "train.log_interval=0: must be >= 1"),
        (SegConfig.load, "optim.opt", "adam", "optim.opt='adam': expected one of 'adamw', 'sgd'"),
        (SegConfig.load, "data.crop_size", [0, 512], r"data.crop_size=\[0, 512\]: expected two integers >= 1"),
        (SegConfig.load, "sched.warmup_iters", 50000, "sched.warmup_iters=50000 exceeds sched.iters=40000"),
        (SegConfig.load, "model.decod", "upernet", r"unknown config key 'model.decod' \(did you mean decode"),
        (SegConfig.load, "optim.lr", float("inf"), r"optim.lr=inf: expected a finite number"),
        (DetConfig.load, "model.center_radius", float("inf"), r"model.center_radius=inf: expected a finite number"),
        (SegConfig.load, "sched.min_lr", 0.01, r"sched.min_lr=0.01 exceeds optim.lr=0.0002: expected sched.min_lr"),
        (DetConfig.load, "sched.warmup_iters", 10**9, r"sched.warmup_iters=1000000000 exceeds sched.iters="),
    ],
)
def test_bad_values_are_refused_naming_value_and_expectation(load, key, value, message):
    with pytest.raises(ValueError, match=message):
        load(None, [(key, value)])


def test_slide_stride_larger_than_the_crop_is_refused():
    with pytest.raises(ValueError, match="eval.stride=.*exceeds eval.crop_size"):
        SegConfig.load(None, [("eval.mode", "slide"), ("eval.stride", [600, 600])])


def test_sgd_is_nesterov_everywhere_and_a_dense_run_takes_it(tmp_path, ade):
    """One optimizer vocabulary: ``sgd`` is classification's Nesterov SGD in the dense runs too
    (they built plain SGD before); the paper's dense recipes use AdamW."""
    opt = build_optimizer(torch.nn.Linear(2, 2), "sgd", 0.1, 0.0)
    assert opt.defaults["momentum"] == 0.9 and opt.defaults["nesterov"]
    s = train(SegTask(), _seg(tmp_path / "sgd", ade, **{"optim.opt": "sgd"}))
    assert s["steps"] == 2 and s["stopped"] is None
    saved = torch.load(tmp_path / "sgd" / LAST, weights_only=False)["optimizer"]["param_groups"][0]
    assert saved["nesterov"] and saved["momentum"] == 0.9


def test_a_dense_run_takes_the_shared_run_settings(tmp_path, ade, capsys):
    """``train.cuda_graphs`` / ``train.channels_last`` are every run's (``RunCfg``): a
    segmentation run asked for graphs on the CPU says in one line why it runs ungraphed (no
    CUDA), and trains channels-last; a detection run says that its targets have no fixed shape."""
    s = train(SegTask(), _seg(tmp_path / "g", ade, **{"train.cuda_graphs": True, "train.channels_last": True}))
    err = capsys.readouterr().err
    assert "train.cuda_graphs=true: running ungraphed: CUDA graphs need a CUDA device, the step runs on cpu" in err
    assert s["steps"] == 2 and s["cuda_graphs"]["graphed"] is False and s["cuda_graphs"]["setting"] is True
    fm = make_fmnist(tmp_path / "fm", n_train=20, n_test=10)
    overrides = det_tiny(tmp_path / "det", fm, **{"sched.iters": 1, "train.cuda_graphs": True})
    d = train(DetTask(), DetConfig.load(overrides=overrides))
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if "cuda_graphs" in ln]
    assert line.startswith("train.cuda_graphs=true: running ungraphed: detection: FCOS's targets are a different")
    assert "shapes that depend on the data" in line and d["cuda_graphs"]["why_not"] in line


@dataclasses.dataclass
class _ModelWithPPM(SegModelCfg):
    pool_scales: tuple[int, ...] = dataclasses.field(default=(1, 2, 3, 6), metadata={"doc": "PPM bins"})


@dataclasses.dataclass
class _ConfigWithPPM(SegConfig):
    model: _ModelWithPPM = dataclasses.field(default_factory=_ModelWithPPM)


def test_a_new_head_setting_is_one_field(monkeypatch):
    seen = {}
    monkeypatch.setattr(seg_task, "build_segmentor", lambda **kw: seen.update(kw) or torch.nn.Linear(1, 1))
    build_from_config(_ConfigWithPPM.from_dict({"model": {"pool_scales": [1, 2]}}), 150)
    assert seen["pool_scales"] == (1, 2) and seen["decode"] == "semantic_fpn" and seen["num_classes"] == 150


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("data.batch_size", 1, "data.batch_size: 2 -> 1"),
        ("sched.iters", 3, "sched.iters: 2 -> 3"),
        ("model.backbone", "inline_swin_tiny", "model.backbone: 'inline_pvt_tiny' -> 'inline_swin_tiny'"),
        ("optim.opt", "sgd", "optim.opt: 'adamw' -> 'sgd'"),  # was KeyError: 'momentum' in SGD's step
    ],
)
def test_resume_refuses_a_changed_batch_schedule_or_backbone(tmp_path, ade, key, value, message):
    train(SegTask(), _seg(tmp_path / "run", ade))
    before = (tmp_path / "run" / LAST).read_bytes()
    changed = _seg(tmp_path / "run", ade, **{"train.resume": "auto", key: value})
    if key == "model.backbone":  # a Swin of the same tiny size: the error must be the config's, not load_state_dict's
        kw = {"embed_dim": 8, "depths": [1, 1, 1, 1], "num_heads": [1, 1, 1, 1], "window_size": 2, "img_size": 32}
        changed = changed.replace(**{"model.backbone_kwargs": kw})
    with pytest.raises(ValueError, match="cannot resume from .*" + message):
        train(SegTask(), changed)
    assert (tmp_path / "run" / LAST).read_bytes() == before  # nothing written


def test_resume_falls_back_without_destroying_the_fallback(tmp_path, ade):
    out = tmp_path / "run"
    train(SegTask(), _seg(out, ade))  # checkpoints at iterations 2 (previous.pth is written by a later save)
    good = torch.load(out / LAST, weights_only=False)
    (out / PREVIOUS).write_bytes((out / LAST).read_bytes())
    (out / LAST).write_bytes(b"truncated")
    s = train(SegTask(), _seg(out, ade, **{"train.resume": "auto", "train.max_steps": 0}))
    assert s["steps"] == 2  # resumed at the end: the fallback's step
    assert (out / (LAST + ".unreadable")).read_bytes() == b"truncated"
    assert torch.load(out / PREVIOUS, weights_only=False)["step"] == good["step"]  # the fallback survived


def test_rotation_after_a_fallback_keeps_the_good_checkpoint(tmp_path):
    """Classification and dense share it: the next save must not rotate the unreadable last.pth
    over previous.pth."""
    save_rotating({"step": 1}, tmp_path)
    save_rotating({"step": 2}, tmp_path)
    (tmp_path / LAST).write_bytes(b"\x00" * 10)

    def load(p):
        try:
            return torch.load(p, weights_only=False)
        except Exception as e:
            raise ValueError(f"{p}: unreadable ({e})") from None

    path, ckpt = load_resume("auto", tmp_path, load)
    assert path.name == PREVIOUS and ckpt["step"] == 1
    save_rotating({"step": 3}, tmp_path)
    save_rotating({"step": 4}, tmp_path)  # crash here and previous.pth must still resume
    assert load(tmp_path / PREVIOUS)["step"] == 3 and load(tmp_path / LAST)["step"] == 4


def test_both_checkpoints_unreadable_stops_instead_of_restarting(tmp_path, ade):
    out = tmp_path / "run"
    out.mkdir()
    for name in (LAST, PREVIOUS):
        (out / name).write_bytes(b"garbage")
    with pytest.raises(ValueError, match="no readable checkpoint to resume from"):
        train(SegTask(), _seg(out, ade, **{"train.resume": "auto"}))
    assert (out / LAST).read_bytes() == b"garbage" and (out / PREVIOUS).read_bytes() == b"garbage"


def test_a_second_run_on_the_same_output_is_refused(tmp_path, ade):
    with OutputLock(tmp_path / "run"):
        with pytest.raises(ValueError, match="is in use by another run"):
            train(SegTask(), _seg(tmp_path / "run", ade))
    assert train(SegTask(), _seg(tmp_path / "run", ade))["steps"] == 2  # free again once released


def test_a_new_run_into_a_finished_one_is_refused_and_overwrite_moves_it_aside(tmp_path, ade):
    out = tmp_path / "run"
    train(SegTask(), _seg(out, ade))
    before = {n: (out / n).read_bytes() for n in (LAST, "summary.json", "metrics.csv", "config.yaml")}
    with pytest.raises(ValueError, match=f"output folder {out} holds a finished or interrupted run"):
        train(SegTask(), _seg(out, ade))
    assert {n: (out / n).read_bytes() for n in before} == before
    assert train(SegTask(), _seg(out, ade, **{"train.overwrite": True}))["steps"] == 2
    (aside,) = out.glob("replaced-*")
    assert {n: (aside / n).read_bytes() for n in before} == before


def test_sigterm_checkpoints_and_exits_128_plus_signum(tmp_path, ade, monkeypatch):
    real = seg_task.SegTask.losses
    calls = []

    def losses_then_signal(self, *a, **k):
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, *a, **k)

    monkeypatch.setattr(seg_task.SegTask, "losses", losses_then_signal)
    s = train(SegTask(), _seg(tmp_path / "run", ade, **{"sched.iters": 4, "train.checkpoint_interval": 100}))
    assert s["stopped"] == "signal" and s["signal"] == signal.SIGTERM and s["steps"] == 1
    assert torch.load(tmp_path / "run" / LAST, weights_only=False)["step"] == 1
    assert exit_code(s["signal"]) == 128 + signal.SIGTERM


def _imports(path: pathlib.Path) -> list[tuple[str, str]]:
    """(module as written, imported name) of every ``from X import name`` in ``path`` (lazy ones too)."""
    import ast

    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = "." * node.level + (node.module or "")
            out += [(mod, a.name) for a in node.names]
    return out


SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "inline_attn"


def test_runtime_imports_no_task_and_dense_no_private_train_names():
    """runtime/ sits below the tasks; dense/ takes nothing private from train/ nor det from seg."""
    for path in (SRC / "runtime").glob("*.py"):
        for mod, _ in _imports(path):
            top = mod.lstrip(".").split(".")[0] if mod.startswith("..") else ""
            assert top not in {"train", "dense", "analysis", "bench", "experiments", "cli"}, (path.name, mod)
    for path in (SRC / "dense").rglob("*.py"):
        up = "." * len(path.relative_to(SRC).parts)  # the dots that reach the package from this module
        for mod, name in _imports(path):
            if mod.startswith(up + "train"):
                assert not name.startswith("_"), (path.name, mod, name)
    det = [(m, n) for m, n in _imports(SRC / "dense" / "det_task.py") if m == ".seg_task"]
    assert det == [], det


def test_a_config_of_another_task_or_a_dict_is_refused(tmp_path, ade):
    with pytest.raises(ValueError, match="segmentation training takes a SegConfig, got DetConfig"):
        train(SegTask(), DetConfig())
    with pytest.raises(ValueError, match="segmentation training takes a SegConfig, got dict"):
        train(SegTask(), _seg(tmp_path / "run", ade).to_dict())


def test_an_output_under_a_file_is_a_clear_error(tmp_path, ade):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"cannot write the run's outputs into .*file/run \(NotADirectoryError"):
        train(SegTask(), _seg(tmp_path / "file" / "run", ade))
