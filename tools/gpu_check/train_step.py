"""The ``train`` step (on demand: ``--steps train``): the trainer's whole-step CUDA graphs checked
against an ungraphed run.

Two bf16 runs of the Fashion-MNIST demo model at once (``inline-attn train``: 4 epochs of 25 steps
on a 1,600-image subset, with an EMA), with ``train.cuda_graphs`` false and true. Passes when
both learn (every epoch's loss finite, the last below the first), the graphed run replayed its
training and evaluation steps, and the two agree (per-epoch loss within 5 %, top-1 within 3
points). The runs write checkpoints, so they run in a scratch folder that is deleted afterwards:
only their numbers reach the results. Needs the Fashion-MNIST files (``$INLINE_ATTN_FMNIST`` or
the Debian path); without them the step says so and is skipped.
"""

from __future__ import annotations

import csv
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile

from .budget import StepContext
from .tests_step import ROOT

FMNIST_DEFAULT = "/usr/share/datasets/fashion-mnist"
TRAIN_EPOCHS, TRAIN_SUBSET = 4, 1600  # 4 epochs of 25 steps at batch 64
TRAIN_LOSS_RTOL = 0.05  # graphed against ungraphed, per epoch's train loss (bf16: close, not bitwise)
TRAIN_TOP1_ATOL = 3.0  # points of val top-1, model and EMA
LOG_TAIL_CHARS = 4000  # of a failed run's log, kept in errors.txt


def fmnist_dir() -> pathlib.Path | None:
    for cand in (os.environ.get("INLINE_ATTN_FMNIST"), FMNIST_DEFAULT, str(ROOT / "data" / "fashion-mnist")):
        if cand and (pathlib.Path(cand) / "t10k-labels-idx1-ubyte.gz").is_file():
            return pathlib.Path(cand)
    return None


def train_command(data: pathlib.Path, run_dir: pathlib.Path, cuda_graphs: bool) -> list[str]:
    """``inline-attn train`` of the Fashion-MNIST demo model, bf16 on the GPU, with an EMA (updated
    inside the graph when graphed) and ``train.cuda_graphs`` set explicitly."""
    args = {
        "--data.path": str(data),
        "--data.subset": str(TRAIN_SUBSET),
        "--data.val_subset": "1000",  # evaluation batches of 64 and a last one of 40 (run ungraphed)
        "--data.batch_size": "64",
        "--sched.epochs": str(TRAIN_EPOCHS),
        "--sched.warmup_epochs": "0.25",
        "--train.device": "cuda",
        "--train.amp": "bf16",
        "--train.ema": "true",
        "--train.ema_decay": "0.99",
        "--train.ema_batch": "null",
        "--train.cuda_graphs": "true" if cuda_graphs else "false",
        "--train.output": str(run_dir),
        "--train.progress": "false",
        "--train.threads": "0",
    }
    flat = [x for kv in args.items() for x in kv]
    return [sys.executable, "-m", "inline_attn.cli", "train", "-c", str(ROOT / "configs/fmnist/demo.yaml"), *flat]


def read_run(run_dir: pathlib.Path) -> dict:
    """What a finished run left: per-epoch train losses, the final top-1 (model and EMA), steps
    and its ``cuda_graphs`` record."""
    with open(run_dir / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "losses": [float(r["train_loss"]) for r in rows],
        "val_top1": summary["final"].get("val_top1"),
        "val_top1_ema": summary["final"].get("val_top1_ema"),
        "steps": summary.get("steps"),
        "cuda_graphs": summary.get("cuda_graphs", {}),
    }


def _problems(plain: dict, graphed: dict, worst: float) -> list[str]:
    problems = []
    for name, run in (("ungraphed", plain), ("graphed", graphed)):
        losses = run["losses"]
        if len(losses) != TRAIN_EPOCHS or not all(map(math.isfinite, losses)) or not losses[-1] < losses[0]:
            problems.append(f"{name} run did not learn (train loss by epoch {losses})")
    cg = graphed.get("cuda_graphs") or {}
    if not cg.get("graphed") or cg.get("train_replays") != graphed.get("steps") or not cg.get("eval_replays"):
        problems.append(f"the graphed run did not replay its steps ({cg})")
    if not worst <= TRAIN_LOSS_RTOL:
        problems.append(f"train losses differ by up to {100 * worst:.1f} % (allowed {100 * TRAIN_LOSS_RTOL:.0f} %)")
    for key in ("val_top1", "val_top1_ema"):
        a, b = plain.get(key), graphed.get(key)
        if a is None or b is None or abs(a - b) > TRAIN_TOP1_ATOL:
            problems.append(f"{key} {a} ungraphed against {b} graphed (allowed {TRAIN_TOP1_ATOL:g} points)")
    return problems


def compare_train_runs(plain: dict, graphed: dict) -> dict:
    """The verdict on an ungraphed and a CUDA-graphed run of the same recipe (:func:`read_run`'s
    records): both learn, the graphed run really replayed its steps (every training step, and the
    evaluation), and the two agree: each epoch's train loss within :data:`TRAIN_LOSS_RTOL`, top-1
    of the model and of the EMA within :data:`TRAIN_TOP1_ATOL` points."""
    gaps = [abs(g - u) / max(abs(u), 1e-12) for u, g in zip(plain["losses"], graphed["losses"])]
    worst = max(gaps, default=math.nan)
    problems = _problems(plain, graphed, worst)
    cg = graphed.get("cuda_graphs") or {}
    runs = (("ungraphed", plain), ("graphed", graphed))
    losses = "; ".join(f"{name} {', '.join(f'{v:.3f}' for v in run['losses'])}" for name, run in runs)
    verdict = "pass" if not problems else "FAIL: " + "; ".join(problems)
    summary = (
        f"bf16, {graphed.get('steps')} steps each, train.cuda_graphs false / true: train loss by epoch {losses} "
        f"(largest gap {100 * worst:.2f} %); val top-1 {plain.get('val_top1')} / {graphed.get('val_top1')}, "
        f"EMA {plain.get('val_top1_ema')} / {graphed.get('val_top1_ema')}; {cg.get('train_replays')} training "
        f"and {cg.get('eval_replays')} evaluation replays: {verdict}"
    )
    return {"ok": not problems, "summary": summary, "loss_gap": worst, "problems": problems}


def _run_both(ctx: StepContext, data: pathlib.Path, scratch: pathlib.Path) -> list[str]:
    """Start both runs at once (they are compared, not timed), wait within the box -> failures."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = {}
    for graphed in (False, True):
        name = "graphed" if graphed else "ungraphed"
        log = open(scratch / f"{name}.log", "w")
        cmd = train_command(data, scratch / name, graphed)
        procs[name] = (subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True, env=env), log)
    failed = []
    for name, (proc, log) in procs.items():
        try:
            code = proc.wait(timeout=max(ctx.seconds_left(), 1.0))
        except subprocess.TimeoutExpired:
            proc.kill()
            code = f"killed at the end of the box ({proc.wait()})"
        log.close()
        if code != 0:
            failed.append(f"{name} run exited {code}")
            ctx.error(f"train {name}", (scratch / f"{name}.log").read_text(errors="replace")[-LOG_TAIL_CHARS:])
    return failed


def run(ctx: StepContext) -> dict:
    """Both runs in a scratch folder, compared (:func:`compare_train_runs`); the folder, with its
    checkpoints, is deleted afterwards."""
    data = fmnist_dir()
    if data is None:
        why = "no Fashion-MNIST files (set INLINE_ATTN_FMNIST to the folder of the four .gz files)"
        return {"ok": None, "summary": f"skipped: {why}"}
    with tempfile.TemporaryDirectory(prefix="gpu-check-train-") as tmp:
        scratch = pathlib.Path(tmp)
        failed = _run_both(ctx, data, scratch)
        if failed:
            return {"ok": False, "summary": "inline-attn train: " + "; ".join(failed) + " (errors.txt)"}
        plain, graphed = read_run(scratch / "ungraphed"), read_run(scratch / "graphed")
    return {**compare_train_runs(plain, graphed), "ungraphed": plain, "graphed": graphed}
