"""``inline-attn seg|det demo`` and ``compare``: one code path serves both tasks; each prints its
result lines and leaves a checkpoint that ``eval`` accepts. Tiny budgets on the real mosaics."""

from __future__ import annotations

import json
import pathlib

import pytest

from inline_attn.cli import main

TINY_PVT = {"embed_dims": [8, 8, 16, 16], "num_heads": [1, 1, 1, 1], "mlp_ratios": [2, 2, 2, 2], "depths": [1] * 4}


def tiny_args(task: str) -> list[str]:
    ov = {
        "model.backbone_kwargs": json.dumps(dict(TINY_PVT, img_size=64)),
        "data.batch_size": "2",
        "data.mosaic.train": "8",
        "data.mosaic.val": "3",
        "sched.iters": "2",
        "sched.warmup_iters": "1",
        "train.progress": "false",
    }
    ov.update({"model.neck_channels": "8"} if task == "det" else {"model.channels": "8", "model.neck_channels": "8"})
    return [a for k, v in ov.items() for a in (f"--{k}", v)]


@pytest.mark.parametrize("task,metric", [("seg", "mIoU"), ("det", "box AP")])
def test_demo_prints_its_result_and_a_checkpoint_eval_accepts(task, metric, tmp_path, capsys):
    out = tmp_path / "demo"
    assert main([task, "demo", "--output", str(out), *tiny_args(task)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"{task} demo: ")
    assert f"{task} demo finished in" in printed and metric in printed
    assert f"evaluate again: inline-attn {task} eval --checkpoint {out / 'last.pth'}" in printed
    assert ("predictions:" if task == "seg" else "detections:") in printed
    assert main([task, "eval", "--checkpoint", str(out / "last.pth"), "--json", str(tmp_path / "r.json")]) == 0
    res = json.loads((tmp_path / "r.json").read_text())
    assert ("mIoU" if task == "seg" else "AP") in res


def test_compare_writes_its_table(tmp_path, capsys):
    args = ["det", "compare", "--seeds", "0", "--patterns", "IIII", "--output", str(tmp_path / "cmp")]
    assert main([*args, *tiny_args("det")]) == 0
    text = (tmp_path / "cmp" / "report.md").read_text()  # the table, in the output folder
    assert text.startswith("## Detection") and "inline-attn det compare --seeds 0 --patterns IIII" in text
    assert "IIII" in text and "box AP" in text and text in capsys.readouterr().out


@pytest.fixture(scope="module")
def demo_checkpoints(tmp_path_factory):
    """A seg and a det demo checkpoint, trained once for the eval checks below."""
    out = {}
    for task in ("seg", "det"):
        folder = tmp_path_factory.mktemp(task)
        assert main([task, "demo", "--output", str(folder), *tiny_args(task)]) == 0
        out[task] = folder / "last.pth"
    return out


@pytest.mark.parametrize("task", ["seg", "det"])
def test_eval_refuses_model_overrides_it_cannot_apply(task, demo_checkpoints, capsys):
    # issue 26: seg eval accepted --model.* overrides, ignored them and printed them as applied
    ckpt = demo_checkpoints[task]
    assert main([task, "eval", "--checkpoint", str(ckpt), "--set", "model.backbone=inline_swin_tiny"]) == 2
    assert "builds the model from the checkpoint: --model.backbone cannot change it" in capsys.readouterr().err


@pytest.mark.parametrize(
    "task, argv, message",
    [
        ("seg", ["--set", "sched.iters=5"], "--sched.iters: seg eval reads only the data and eval settings;"),
        (
            "det",
            ["--set", "train.seed=1"],
            "--train.seed: det eval reads only the data and eval settings and train.threads;",
        ),
        ("seg", ["--device", "gpu"], "--device='gpu': expected auto, cpu, cuda or cuda:N"),
        ("det", ["--device", "gpu"], "--device='gpu': expected auto, cpu, cuda or cuda:N"),
    ],
    ids=["seg-sched", "det-train", "seg-device", "det-device"],
)
def test_eval_refuses_settings_it_does_not_read(task, argv, message, demo_checkpoints, capsys):
    """Issue 36: training settings were accepted by eval and ignored; det eval's bad --device was a
    raw RuntimeError, seg eval's named train.device."""
    assert main([task, "eval", "--checkpoint", str(demo_checkpoints[task]), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inline-attn: error: ") and message in err, err


@pytest.mark.parametrize("task,other", [("seg", "det"), ("det", "seg")])
def test_eval_names_a_checkpoint_of_the_other_task(task, other, demo_checkpoints, capsys):
    # issue 26: a detection checkpoint in seg eval was a raw KeyError: 'decode'
    assert main([task, "eval", "--checkpoint", str(demo_checkpoints[other])]) == 2
    err = capsys.readouterr().err
    kind = {"seg": "segmentation", "det": "detection"}[other]
    assert f"is a {kind} checkpoint: evaluate it with `inline-attn {other} eval`" in err


def test_seg_eval_refuses_data_with_another_class_count(demo_checkpoints, tmp_path, capsys):
    # issue 26: an 11-class checkpoint was scored on 150-class ADE20K without a word
    from seg_helpers import make_ade

    ade = make_ade(tmp_path / "ade")
    argv = ["seg", "eval", "--checkpoint", str(demo_checkpoints["seg"]), "--data.dataset", "ade20k"]
    assert main([*argv, "--data.path", str(ade)]) == 2
    assert "predicts 11 classes, the evaluation data has 150" in capsys.readouterr().err


def test_mosaics_command_writes_coco_and_a_png(tmp_path, capsys):
    argv = ["seg", "mosaics", "--num", "3", "--coco", str(tmp_path / "coco"), "--png", str(tmp_path / "m.png")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"COCO instances: {tmp_path / 'coco' / 'annotations' / 'instances_val.json'} (3 mosaics" in out
    assert len(list((tmp_path / "coco" / "images").glob("*.png"))) == 3 and (tmp_path / "m.png").stat().st_size > 0
    assert main(["seg", "mosaics", "--num", "3"]) == 2
    assert "nothing to do: give --coco DIR and/or --png FILE" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--coco", "{tmp}/coco", "--rows", "2"], "--rows 2 sets the rows of the --png FILE: give --png, or no --rows"),
        (["--png", "{tmp}/m.png", "--rows", "0"], "--rows 0: expected 1 to 3 (the number of mosaics)"),
        (["--png", "{tmp}/m.png", "--rows", "4"], "--rows 4: expected 1 to 3 (the number of mosaics)"),
        (["--png", "{tmp}/m.png", "--max-overlap", "-0.1"], "max_overlap=-0.1 must be a fraction in [0, 1]"),
        (["--png", "{tmp}/m.png", "--max-overlap", "nan"], "max_overlap=nan must be a fraction in [0, 1]"),
        (["--png", "{tmp}/m.png", "--seed", "-1"], "seed=-1: must be >= 0"),
        (["--png", "{tmp}/m.png", "--objects", "0", "2"], "objects=(0, 2) must satisfy 1 <= min <= max"),
        (["--png", "{tmp}/m.png", "--size", "20"], "a garment of scale 1.0 (28 px) does not fit a 20 px mosaic"),
    ],
    ids=["rows-without-png", "rows-0", "rows-over-num", "overlap-negative", "overlap-nan", "seed", "objects", "size"],
)
def test_mosaics_refuses_an_argument_it_would_ignore_or_fail_on(tmp_path, capsys, argv, message):
    """Issue 36: --rows without --png was ignored, more rows than mosaics silently shrank, a
    negative seed failed inside numpy, an overlap outside [0, 1] was taken."""
    argv = ["seg", "mosaics", "--num", "3", *(a.format(tmp=tmp_path) for a in argv)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("inline-attn: error: ") and message in err, err
    assert not (tmp_path / "m.png").exists() and not (tmp_path / "coco" / "annotations").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--set", "train.output=x"],
            "--train.output: seg info reports the parameters of the model section's segmentor",
        ),
        (["--model.pretrained", "x.pth"], "--model.pretrained: seg info reports"),
        (["--data.crop_size", "[256, 256]"], "--data.crop_size: seg info reports"),
    ],
    ids=["train-section", "weights", "crop-size-without-macs"],
)
def test_seg_info_refuses_a_setting_that_changes_nothing_it_reports(capsys, argv, message):
    config = pathlib.Path(__file__).parents[2] / "configs" / "ade20k" / "semantic_fpn_inline_pvt_tiny.yaml"
    assert main(["seg", "info", "-c", str(config), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inline-attn: error: ") and message in err, err


@pytest.mark.parametrize("task,metric", [("seg", "mIoU"), ("det", "AP")])
def test_evaluate_checkpoint_is_the_commands_evaluation(task, metric, demo_checkpoints, tmp_path, capsys):
    import importlib

    evaluate_checkpoint = importlib.import_module(f"inline_attn.dense.{task}_task").evaluate_checkpoint
    res = evaluate_checkpoint(demo_checkpoints[task], json_path=tmp_path / "r.json")
    assert (tmp_path / "r.json").read_text() == json.dumps(res, indent=2)  # write_json; NaN IoU: compare text
    assert res["checkpoint"] == str(demo_checkpoints[task]) and res["images"] > 0 and metric in res
    assert main([task, "eval", "--checkpoint", str(demo_checkpoints[task])]) == 0
    assert f"({res['images']} images" in capsys.readouterr().out


@pytest.mark.parametrize("task,what", [("seg", "class scores"), ("det", "class logits")])
def test_eval_of_a_checkpoint_with_nan_weights_is_refused(task, what, demo_checkpoints, tmp_path, capsys):
    # issue 36: seg eval scored NaN weights as the all-background mIoU, with exit 0 (det: no detections)
    import torch

    state = torch.load(demo_checkpoints[task], map_location="cpu", weights_only=False)
    for v in state["model"].values():
        if v.is_floating_point():
            v.fill_(float("nan"))
    bad = tmp_path / "nan.pth"
    torch.save(state, bad)
    assert main([task, "eval", "--checkpoint", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {bad}: " in err and f"{what} are NaN or inf; a model whose outputs are not finite" in err


def test_eval_help_lists_only_the_settings_evaluation_reads(capsys):
    from inline_attn.cli import main

    for argv in (["seg", "eval", "--help"], ["det", "eval", "--help"], ["seg", "info", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        text = capsys.readouterr().out
        assert "--set KEY=VALUE" in text and ("--data.path" in text or "--model.backbone" in text)
        assert not any(f"--{s}." in text for s in ("optim", "sched", "train.seed", "train.output")), argv
