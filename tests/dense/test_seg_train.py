"""Segmentation training: resume equality, torchrun-style processes, the command line, bad
checkpoints, and a short training run on real Fashion-MNIST mosaics that must learn."""

from __future__ import annotations

import json
import pathlib
import socket

import pytest
import torch
import torch.multiprocessing as mp

from inline_attn.cli import main
from inline_attn.dense.config import SegConfig
from inline_attn.dense.seg_task import SegTask, load_segmentor
from inline_attn.runtime.run import train
from inline_attn.runtime.optim import PolySchedule

from seg_helpers import make_ade


def tiny_overrides(out, **extra) -> list:
    """A tiny PVT + Semantic FPN on a synthetic ADE20K folder (no Fashion-MNIST needed)."""
    ov = {
        "model.backbone_kwargs": {
            "embed_dims": [8, 8, 16, 16],
            "num_heads": [1, 1, 1, 1],
            "mlp_ratios": [2, 2, 2, 2],
            "depths": [1, 1, 1, 1],
            "img_size": 32,
        },
        "model.neck_channels": 8,
        "model.channels": 8,
        "model.drop_path": 0.0,
        "data.scale": [64, 32],
        "data.crop_size": [32, 32],
        "data.batch_size": 2,
        "data.workers": 0,
        "optim.lr": 1.0e-3,
        "sched.iters": 4,
        "eval.interval": 0,
        "train.output": str(out),
        "train.progress": False,
        "train.log_interval": 1,
        "train.checkpoint_interval": 2,
        "train.predictions_png": False,
        "train.deterministic": True,
    }
    ov.update(extra)
    return list(ov.items())


@pytest.fixture
def ade(tmp_path):
    return str(make_ade(tmp_path / "ade", n_train=4, n_val=2))


def test_poly_schedule_by_hand():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    s = PolySchedule(opt, lr=6e-5, iters=100, power=1.0, warmup_iters=10, warmup_ratio=1e-6)
    assert s.lr_at(0) == pytest.approx(6e-5 * 1e-6)
    assert s.lr_at(5) == pytest.approx(6e-5 * (1 - 5 / 100) * (1 - 0.5 * (1 - 1e-6)))
    assert s.lr_at(50) == pytest.approx(6e-5 * 0.5)
    assert s.lr_at(100) == 0.0
    s.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(s.lr_at(1))


def test_resume_equals_uninterrupted(tmp_path, ade):
    straight = train(SegTask(), SegConfig.load(overrides=tiny_overrides(tmp_path / "a", **{"data.path": ade})))
    assert straight["steps"] == 4 and straight["stopped"] is None
    cut = train(
        SegTask(), SegConfig.load(overrides=tiny_overrides(tmp_path / "b", **{"data.path": ade, "train.max_steps": 2}))
    )
    assert cut["stopped"] == "max_steps" and cut["steps"] == 2
    resumed = train(
        SegTask(),
        SegConfig.load(overrides=tiny_overrides(tmp_path / "b", **{"data.path": ade, "train.resume": "auto"})),
    )
    assert resumed["steps"] == 4
    a = torch.load(tmp_path / "a" / "last.pth", weights_only=False)["model"]
    b = torch.load(tmp_path / "b" / "last.pth", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["mIoU"] == pytest.approx(straight["mIoU"])
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["steps"] == 4 and (tmp_path / "b" / "metrics.csv").read_text().count("\n") == 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, cfg, q):
    torch.set_num_threads(1)
    s = train(SegTask(), cfg, rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    q.put((rank, s["mIoU"]))


def test_two_processes(tmp_path, ade):
    cfg = SegConfig.load(overrides=tiny_overrides(tmp_path / "ddp", **{"data.path": ade, "sched.iters": 2}))
    q = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_worker, args=(2, _free_port(), cfg, q), nprocs=2, join=True, start_method="spawn")
    got = dict(q.get() for _ in range(2))
    assert got[0] == got[1]  # the confusion matrices were summed across the two processes
    model, _ = load_segmentor(tmp_path / "ddp" / "last.pth")
    cfg1 = SegConfig.load(overrides=tiny_overrides(tmp_path / "one", **{"data.path": ade}))
    from inline_attn.dense.data.loading import build_seg_datasets
    from inline_attn.dense.seg_task import evaluate_seg

    _, val = build_seg_datasets(cfg1, train=False)
    assert evaluate_seg(model, val, cfg1, torch.device("cpu"))["mIoU"] == pytest.approx(got[0])


def test_command_line_train_eval_info(tmp_path, ade, capsys):
    args = ["seg", "train", "--output", str(tmp_path / "run"), "--data.path", ade]
    for k, v in tiny_overrides(tmp_path / "run"):
        if k != "train.output":
            args += [f"--{k}", json.dumps(v) if not isinstance(v, str) else v]
    assert main(args) == 0
    assert "done: mIoU" in capsys.readouterr().out
    ckpt = str(tmp_path / "run" / "last.pth")
    png = tmp_path / "pred.png"
    assert (
        main(
            [
                "seg",
                "eval",
                "--checkpoint",
                ckpt,
                "--per-class",
                "--json",
                str(tmp_path / "r.json"),
                "--png",
                str(png),
                "--eval.mode",
                "slide",
                "--eval.crop_size",
                "[24, 24]",
                "--eval.stride",
                "[16, 16]",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "mIoU" in out and "slide inference" in out and "wall" in out and png.is_file()
    assert json.loads((tmp_path / "r.json").read_text())["classes"][0] == "wall"
    assert main(["seg", "info", "-c", "configs/ade20k/semantic_fpn_inline_pvt_tiny.yaml"]) == 0
    assert "15,785,878" in capsys.readouterr().out
    assert main(["info", "configs/ade20k/semantic_fpn_inline_pvt_tiny.yaml", "--no-macs"]) == 0
    assert "15,785,878" in capsys.readouterr().out


def test_checkpoint_of_another_model_is_refused(tmp_path, ade):
    train(SegTask(), SegConfig.load(overrides=tiny_overrides(tmp_path / "a", **{"data.path": ade, "sched.iters": 1})))
    ckpt = tmp_path / "a" / "last.pth"
    other_classes = SegConfig.load(
        overrides=tiny_overrides(
            tmp_path / "b",
            **{"data.path": ade, "model.checkpoint": str(ckpt), "data.dataset": "mosaic", "sched.iters": 1},
        )
    )
    from inline_attn.dense.seg_task import build_from_config

    with pytest.raises(ValueError, match="predicts 150 classes, the model 11"):
        build_from_config(other_classes, 11)
    other_backbone = SegConfig.load(
        overrides=tiny_overrides(
            tmp_path / "c",
            **{"data.path": ade, "model.checkpoint": str(ckpt), "model.backbone_kwargs": {"depths": [2, 1, 1, 1]}},
        )
    )
    with pytest.raises(ValueError, match="does not fit the model .* unexpected|missing"):
        build_from_config(other_backbone, 150)
    with pytest.raises(ValueError, match="model.num_classes=5 but the dataset has 150"):
        build_from_config(SegConfig.load(overrides=[("model.num_classes", 5)]), 150)
    assert main(["seg", "eval", "--checkpoint", str(tmp_path / "nope.pth")]) == 2


def test_compare_table_mean_and_std():
    from inline_attn.experiments.dense_compare import format_table

    rows = [
        dict(pattern="IIII", seed=s, mIoU=v, mAcc=v + 10, aAcc=90.0, params=100, train_time_s=60.0)
        for s, v in ((0, 30.0), (1, 34.0), (2, 32.0))
    ]
    rows.append(dict(pattern="SSSS", seed=0, mIoU=20.0, mAcc=25.0, aAcc=85.0, params=120, train_time_s=120.0))
    table = format_table(rows, command="inline-attn seg compare", config="c.yaml")
    assert "| 32.00 +- 2.00 | 42.00 +- 2.00 | 90.00 +- 0.00 | 30.00, 34.00, 32.00 | 100 | 1.0 |" in table
    assert "| 20.00 +- 0.00 |" in table


def test_mosaic_training_learns(tmp_path):
    """~60 s on real Fashion-MNIST mosaics (the Debian package; `make test` installs it): the
    demo's model and recipe, shortened. Predicting background everywhere scores
    100 * (background share) / 11 mIoU; the run must beat that and background-only aAcc.

    Why it clips gradients (issue 26): shortened to 300 iterations at the demo's lr 4e-3 held
    constant, the unclipped run meets gradient spikes (norm 7-11 against a typical 0.5, at steps
    50-175) that throw it back to predicting background everywhere: 7.28 mIoU, the background-only
    score, on a fresh AVX512 machine (9.37 on the machine where the test was first written). The
    full demo recovers from them while its lr decays (38.2 mIoU, stable over seeds); this short run
    has no decay to recover in. Clipping at 1.0 removes the spikes (max norm 1.6) and the run learns
    on every seed and instruction set tried."""
    from inline_attn.dense.data.loading import build_seg_datasets
    from inline_attn.dense.metrics import SegMetric

    cfg = SegConfig.load(
        "configs/mosaic/demo.yaml",
        [
            ("sched.iters", 300),
            ("sched.warmup_iters", 20),
            ("sched.power", 0.0),
            ("data.batch_size", 8),
            ("data.mosaic.train", 1500),
            ("data.mosaic.val", 100),
            ("train.output", str(tmp_path)),
            ("train.progress", False),
            ("train.predictions_png", False),
            ("train.checkpoint_interval", 1000),
            ("optim.clip_grad", 1.0),
        ],
    )
    s = train(SegTask(), cfg)
    _, val = build_seg_datasets(cfg, train=False)
    bg_only = SegMetric(11)
    for i in range(len(val)):
        bg_only.update(torch.zeros_like(val[i][1]), val[i][1])
    base = bg_only.compute()
    print(
        f"mIoU {s['mIoU']:.2f} (background everywhere: {base['mIoU']:.2f}), aAcc {s['aAcc']:.2f} "
        f"(background everywhere: {base['aAcc']:.2f}), {s['train_time_s']:.0f} s"
    )
    assert s["aAcc"] > base["aAcc"]
    # measured (2026-11-24, 2-core AVX512 machine, torch 2.13.0+cpu, constraints.txt): 16.88 mIoU
    # against 7.28 background-only (seed 0); seeds 1-3 (train and mosaic seed) 17.12 / 17.05 / 19.80.
    # With oneDNN, MKL and ATen held to AVX2 (DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
    # ATEN_CPU_CAPABILITY=avx2): 18.73 / 17.37 / 12.71 / 17.11 for seeds 0-3. Unclipped: 7.28.
    # The bar, 3 points above background-only, leaves 6.6 points for this seed-0 run and 2.4 for
    # the weakest run seen.
    assert s["mIoU"] > base["mIoU"] + 3.0


SEG_CONFIGS = sorted(
    str(p)
    for d in ("ade20k", "mosaic")
    for p in (pathlib.Path("configs") / d).glob("*.yaml")
    if not p.name.startswith(("_", "det_"))  # det_*: detection configs (tests/dense/test_det_train.py)
)


@pytest.mark.parametrize("path", SEG_CONFIGS)
def test_every_segmentation_recipe_builds(path):
    """Each shipped segmentation config loads and its segmentor builds (on the meta device)."""
    from inline_attn.dense.seg_task import build_from_config

    cfg = SegConfig.load(path)
    with torch.device("meta"):
        model = build_from_config(cfg, 11 if cfg.data.dataset == "mosaic" else 150)
    assert model.backbone.name == cfg.model.backbone
    assert (model.aux_head is not None) == (cfg.model.decode == "upernet")
