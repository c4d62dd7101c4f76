"""``inline-attn seg|det demo`` and ``compare``: one code path serves both tasks; each prints its
result lines and leaves a checkpoint that ``eval`` accepts. Tiny budgets on the real mosaics."""

from __future__ import annotations

import json

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
    doc = tmp_path / "dense.md"
    doc.write_text("# dense\n")
    args = ["det", "compare", "--seeds", "0", "--patterns", "IIII", "--output", str(tmp_path / "cmp")]
    assert main([*args, "--doc", str(doc), *tiny_args("det")]) == 0
    text = doc.read_text()
    assert text.startswith("# dense") and "inline-attn det compare --seeds 0 --patterns IIII" in text
    assert "IIII" in text and "box AP" in capsys.readouterr().out + text
