"""Detection training: a short run on real Fashion-MNIST mosaics whose loss falls, resume equal
to an uninterrupted run, the command line (train, eval with PNG), bad checkpoints, the configs."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest
import torch

from inline_attn.cli import main
from inline_attn.dense.config import DetConfig
from inline_attn.dense.det_task import DetTask, load_detector
from inline_attn.runtime.run import train

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "train"))
from train_helpers import make_fmnist  # noqa: E402


def tiny(out, root, **extra) -> list:
    """A tiny PVT + FCOS on mosaics of a synthetic Fashion-MNIST (no real data needed)."""
    ov = {
        "model.backbone_kwargs": {
            "embed_dims": [8, 8, 16, 16],
            "num_heads": [1, 1, 1, 1],
            "mlp_ratios": [2, 2, 2, 2],
            "depths": [1, 1, 1, 1],
            "img_size": 64,
        },
        "model.neck_channels": 8,
        "model.num_convs": 1,
        "model.drop_path": 0.0,
        "data.path": str(root),
        "data.batch_size": 2,
        "data.mosaic.train": 8,
        "data.mosaic.val": 3,
        "sched.iters": 4,
        "eval.interval": 0,
        "eval.batch_size": 2,
        "train.output": str(out),
        "train.progress": False,
        "train.log_interval": 1,
        "train.checkpoint_interval": 2,
        "train.predictions_png": False,
    }
    ov.update(extra)
    return list(ov.items())


@pytest.fixture
def fm(tmp_path):
    return make_fmnist(tmp_path / "fm", n_train=20, n_test=10)


def test_resume_equals_uninterrupted(tmp_path, fm):
    full = train(DetTask(), DetConfig.load(None, tiny(tmp_path / "a", fm)))
    train(DetTask(), DetConfig.load(None, tiny(tmp_path / "b", fm, **{"train.max_steps": 2})))
    resumed = train(DetTask(), DetConfig.load(None, tiny(tmp_path / "b", fm, **{"train.resume": "auto"})))
    assert resumed["steps"] == full["steps"] == 4
    a = torch.load(tmp_path / "a" / "last.pth", weights_only=False)["model"]
    b = torch.load(tmp_path / "b" / "last.pth", weights_only=False)["model"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    assert resumed["AP"] == pytest.approx(full["AP"])


def test_command_line_train_eval(tmp_path, fm, capsys):
    out = tmp_path / "run"
    cfg = tmp_path / "c.yaml"
    import yaml

    tree: dict = {}
    for k, v in tiny(out, fm, **{"train.predictions_png": True}):
        node = tree
        *head, last = k.split(".")
        for h in head:
            node = node.setdefault(h, {})
        node[last] = v
    cfg.write_text(yaml.safe_dump(tree))
    assert main(["det", "train", "-c", str(cfg)]) == 0
    assert "done: box AP" in capsys.readouterr().out
    for f in ("last.pth", "config.yaml", "metrics.csv", "summary.json", "detections.png"):
        assert (out / f).is_file(), f
    assert (
        main(
            [
                "det",
                "eval",
                "--checkpoint",
                str(out / "last.pth"),
                "--json",
                str(tmp_path / "r.json"),
                "--png",
                str(tmp_path / "d.png"),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    res = json.loads((tmp_path / "r.json").read_text())
    assert f"box AP {res['AP']:.2f}" in printed and (tmp_path / "d.png").is_file()
    assert res["AP"] == pytest.approx(json.loads((out / "summary.json").read_text())["AP"])
    model, _ = load_detector(out / "last.pth")
    assert model.num_classes == 10


def test_segmentation_checkpoint_is_refused(tmp_path, fm):
    torch.save({"model": {}, "step": 1}, tmp_path / "x.pth")
    with pytest.raises(ValueError, match="not a detection checkpoint"):
        load_detector(tmp_path / "x.pth")
    with pytest.raises(ValueError, match="data.dataset='voc'"):
        train(DetTask(), DetConfig.load(None, tiny(tmp_path / "o", fm, **{"data.dataset": "voc"})))
    with pytest.raises(ValueError, match="data.coco"):
        train(DetTask(), DetConfig.load(None, tiny(tmp_path / "o", fm, **{"data.dataset": "coco"})))
    with pytest.raises(ValueError, match="unknown config key 'model.decode'"):
        DetConfig.load(None, [("model.decode", "upernet")])


def test_mosaic_training_loss_falls(tmp_path):
    """<= 60 s on real Fashion-MNIST mosaics (the Debian package; `make test` installs it): the
    demo's model and recipe, shortened. The loss of the last 9 iterations must be well below
    that of the first 9, and the detector must find garments (AP50 above 0)."""
    cfg = DetConfig.load(
        "configs/mosaic/det_demo.yaml",
        [
            ("sched.iters", 45),
            ("sched.warmup_iters", 10),
            ("data.batch_size", 8),
            ("data.mosaic.train", 360),
            ("data.mosaic.val", 50),
            ("eval.batch_size", 50),
            ("train.output", str(tmp_path)),
            ("train.progress", False),
            ("train.predictions_png", False),
            ("train.log_interval", 9),
            ("train.checkpoint_interval", 1000),
        ],
    )
    s = train(DetTask(), cfg)
    print(
        f"loss {s['first_loss']:.3f} -> {s['last_loss']:.3f}, AP {s['AP']:.2f}, AP50 {s['AP50']:.2f}, "
        f"{s['train_time_s']:.0f} s"
    )
    # measured (2026-11-24, issue 26's knife-edge check): last/first loss 0.631 and AP50 12.26 (seed 0);
    # seeds 1-3 (train and mosaic seed) 0.630-0.644 and AP50 9.6-13.5; the same with oneDNN, MKL and
    # ATen held to AVX2 (0.629-0.644, AP50 9.6-13.4). Both bars hold with a wide margin.
    assert s["last_loss"] < 0.75 * s["first_loss"]
    assert s["AP50"] > 0


DET_CONFIGS = sorted(str(p) for p in (pathlib.Path("configs") / "mosaic").glob("det_*.yaml"))


@pytest.mark.parametrize("path", DET_CONFIGS)
def test_every_detection_recipe_builds(path):
    from inline_attn.dense.det_task import build_det_from_config

    cfg = DetConfig.load(path)
    with torch.device("meta"):
        model = build_det_from_config(cfg, 10)
    assert model.num_classes == 10
