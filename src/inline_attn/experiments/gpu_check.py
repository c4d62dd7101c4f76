"""``make gpu-check``: validate and time the GPU path on one CUDA machine, in one command.

Steps (each recorded, a failing step does not stop the rest), in the order they run:

1. ``train``: two 100-step bf16 training runs of the Fashion-MNIST demo model on the GPU, at once
   (``inline-attn train``: 4 epochs of 25 steps on a 1,600-image subset, with an EMA), one with
   ``train.cuda_graphs`` false and one with it true; passes when both learn (every epoch's loss
   finite, the last below the first), the graphed run replayed its training and evaluation steps,
   and the two agree (per-epoch loss within 5 %, top-1 within 3 points): the only check of the
   trainer's CUDA-graph capture itself. Needs the Fashion-MNIST files (``$INLINE_ATTN_FMNIST`` or
   the Debian path); without them the step says so and is skipped.
2. ``core``: the Triton layer core alone, bf16, its achieved bandwidth (fewest bytes / time)
   against the device's copy rate.
3. ``layer``: the attention layers over 7..112 tokens per side, fwd and fwd+bwd, bf16 autocast:
   InLine fused (Triton), InLine eager (the authors' order of operations), softmax through SDPA
   (flash / memory-efficient), softmax explicit (as the authors compute it), linear.
4. ``window`` / ``resolution``: the paper's Fig. 6 sweeps (Swin-T vs InLine-Swin-T over windows,
   DeiT-T vs InLine-DeiT-T over resolutions) in inference and training, bf16 autocast, with the
   InLine models fused and eager.
5. ``compile``: training throughput of InLine-Swin-T (window 7) and InLine-DeiT-T, eager vs
   ``torch.compile``.
6. ``profile``: how much of a layer's and a model's step the GPU is busy (``torch.profiler``),
   against the step's time: where the time goes when the kernels are not the bottleneck.
7. ``graphs``: eager against CUDA-graphed steps, the same mode on both sides (layers with the SDPA
   backend that ran, flash and cuDNN held, explicit softmax; InLine-DeiT-T vs DeiT-T training at
   batch 128); :func:`goal_table` prints issue 23's goals pass / FAIL with the device named.
   ``autotune`` (only when named in ``--steps``): the Triton core's tile sweep, whose winners go to
   ``triton_tuning.json`` (copied to ``src/inline_attn/ops/fused/`` for later runs).
8. ``tests``: the CUDA tests (the Triton kernels natively, the custom ops, compile, whole models
   under autocast) and the RandAugment comparison with timm (importable there), through pytest.

The whole check keeps to a time budget (``--budget-s``, default :data:`BUDGET_S`: the 8 minutes
the check is allowed on one H100, less start-up and packing). A step whose usual time
(:data:`STEP_SECONDS`, measured on an H100) no longer fits is not started and says so. The tests
run last and get the time that is left: on a fresh machine they are mostly JIT compilation with
no fixed length, while every benchmark step is bounded by its own per-case budgets. A test run
that reaches the end of the budget is interrupted (SIGINT), so pytest still prints how many tests
passed and failed until then.

Writes JSON / CSV / PNG per benchmark, ``summary.md`` (device, driver, versions, every table and
the performance goals met or missed) and ``gpu_check.json`` into ``--out``, and packs the folder
as ``gpu_check.tar.gz``. On a machine without CUDA it exits at once (status 2) with a message.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import tarfile
import time
import traceback

import torch

from ..runtime.report import markdown_table

ROOT = pathlib.Path(__file__).resolve().parents[3]  # the repository (tests/, configs/)
FMNIST_DEFAULT = "/usr/share/datasets/fashion-mnist"
BUDGET_S = 460.0  # seconds for all steps: 8 minutes, less about 20 s of start-up and packing
# Each step's usual seconds on an H100 (the 2026-11-23 sessions: train 22-27, core 12, layer 10,
# window 31, resolution 49, compile about 90, profile about 45 as a script); a step is started only
# when this much of the budget is left.
# train: 22-27 s for one 200-step run; now two 100-step runs at once (graphed and not), not yet timed
STEP_SECONDS = {"train": 30, "core": 15, "layer": 15, "window": 35, "resolution": 55, "compile": 90, "profile": 45}
STEP_SECONDS["graphs"] = 20  # not yet run on a GPU: 20 case budgets of 0.5-1 s, graph captures, two SDPA profiles
TESTS_MIN_S = 30.0  # below this the tests step is not started: too little to pass the JIT compiles


def _versions() -> dict:
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "not installed"
    props = torch.cuda.get_device_properties(0)
    info.update(device=props.name, sms=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1))
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        info["driver"] = smi.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["driver"] = "unknown"
    return info


def _copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (the memory-bound ceiling)."""
    from ..bench.timing import time_interleaved

    x = torch.empty(1 << 28, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    t = time_interleaved({"copy": lambda: y.copy_(x)}, warmup=3, repeats=10, device="cuda")["copy"].median
    x = y = None  # free the 1 GiB before emptying the cache
    torch.cuda.empty_cache()
    return 2 * (1 << 28) * 2 / t


TESTS_WORKERS = 4


def tests_command(junit: pathlib.Path, files: list[str], quick: bool, xdist: bool) -> list[str]:
    """The pytest command of the test step. On a fresh machine its time is mostly JIT compilation
    (the Triton kernels for every tested shape, inductor's graphs), which ran past a 300 s box
    serially on an H100's host; with pytest-xdist the test files compile in parallel workers."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *files]
    if xdist:
        cmd += ["-n", str(TESTS_WORKERS)]
    if quick:
        cmd += ["-x"]
    return cmd


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_interruptible(cmd: list[str], log: pathlib.Path, timeout_s: float, grace_s: float = 30.0, **kw) -> int | None:
    """Run ``cmd`` with its output streamed to ``log``; after ``timeout_s`` interrupt it with SIGINT
    (pytest then reports the tests run so far, as after Ctrl-C) and kill it if it has not exited
    ``grace_s`` later. Returns the exit status, or None when it had to be interrupted."""
    with open(log, "w") as fh:  # streamed, so a stopped run still shows how far it got
        # SIGINT back to its default in the child: a shell without job control starts background
        # jobs (`nohup make gpu-check &`) with SIGINT ignored, the child would inherit that, and
        # Python would then never turn the interrupt into KeyboardInterrupt (pytest's counts)
        proc = subprocess.Popen(
            cmd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=_default_sigint,
            **kw,
        )
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        try:  # the whole group: pytest-xdist's workers too
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:  # it ended between the timeout and the signal
            proc.wait()
        return None


def step_tests(out: pathlib.Path, quick: bool, timeout_s: float = BUDGET_S) -> dict:
    # plus the RandAugment comparison with timm itself: timm imports only beside a CUDA build of torch
    files = [
        "tests/ops/test_triton.py",
        "tests/ops/test_custom_ops.py",
        "tests/ops/test_fused_predictor.py",
        "tests/ops/test_triton_tuning.py",
        "tests/ops/test_launch_budget.py",
        "tests/runtime/test_graphs.py",
        "tests/gpu",
        "tests/train/test_rand_augment.py::test_against_timm_itself",
    ]
    cmd = tests_command(out / "tests.xml", files, quick, xdist=importlib.util.find_spec("xdist") is not None)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("TRITON_INTERPRET", None)
    log = out / "tests.log"
    code = run_interruptible(cmd, log, timeout_s, cwd=ROOT, env=env)
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    last = (lines[-1:] or ["(no output)"])[0]
    if code is None:
        return {"ok": False, "summary": f"interrupted after {timeout_s:.0f} s: {last} (tests.log)", "returncode": None}
    return {"ok": code == 0, "summary": last, "returncode": code}


def _fmnist_dir() -> pathlib.Path | None:
    for cand in (os.environ.get("INLINE_ATTN_FMNIST"), FMNIST_DEFAULT, str(ROOT / "data" / "fashion-mnist")):
        if cand and (pathlib.Path(cand) / "t10k-labels-idx1-ubyte.gz").is_file():
            return pathlib.Path(cand)
    return None


TRAIN_EPOCHS, TRAIN_SUBSET = 4, 1600  # 4 epochs of 25 steps at batch 64
TRAIN_LOSS_RTOL = 0.05  # graphed against ungraphed, per epoch's train loss (bf16: close, not bitwise)
TRAIN_TOP1_ATOL = 3.0  # points of val top-1, model and EMA


def _train_command(data: pathlib.Path, run_dir: pathlib.Path, cuda_graphs: bool) -> list[str]:
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


def _train_run(run_dir: pathlib.Path) -> dict:
    """What a finished run left: per-epoch train losses, the final top-1 (model and EMA), steps
    and its ``cuda_graphs`` record."""
    import csv

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


def compare_train_runs(plain: dict, graphed: dict) -> dict:
    """The ``train`` step's verdict on an ungraphed and a CUDA-graphed run of the same recipe
    (:func:`_train_run`'s records): both learn (finite per-epoch losses, the last below the
    first), the graphed run really replayed its steps (every training step but none ungraphed, and
    the evaluation), and the two agree: each epoch's train loss within :data:`TRAIN_LOSS_RTOL`,
    top-1 of the model and of the EMA within :data:`TRAIN_TOP1_ATOL` points."""
    problems = []
    for name, run in (("ungraphed", plain), ("graphed", graphed)):
        losses = run["losses"]
        if len(losses) != TRAIN_EPOCHS or not all(map(math.isfinite, losses)) or not losses[-1] < losses[0]:
            problems.append(f"{name} run did not learn (train loss by epoch {losses})")
    cg = graphed.get("cuda_graphs") or {}
    if not cg.get("graphed") or cg.get("train_replays") != graphed.get("steps") or not cg.get("eval_replays"):
        problems.append(f"the graphed run did not replay its steps ({cg})")
    gaps = [abs(g - u) / max(abs(u), 1e-12) for u, g in zip(plain["losses"], graphed["losses"])]
    worst = max(gaps, default=math.nan)
    if not worst <= TRAIN_LOSS_RTOL:
        problems.append(f"train losses differ by up to {100 * worst:.1f} % (allowed {100 * TRAIN_LOSS_RTOL:.0f} %)")
    for key in ("val_top1", "val_top1_ema"):
        a, b = plain.get(key), graphed.get(key)
        if a is None or b is None or abs(a - b) > TRAIN_TOP1_ATOL:
            problems.append(f"{key} {a} ungraphed against {b} graphed (allowed {TRAIN_TOP1_ATOL:g} points)")
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


def step_train(out: pathlib.Path, quick: bool) -> dict:
    """A bf16 training run of the Fashion-MNIST demo model on the GPU twice, at once: with
    ``train.cuda_graphs`` false and true (the trainer's whole-step CUDA graphs: forward, backward,
    clipping, the capturable AdamW, the EMA, and the evaluation forward). Passes when both learn,
    the graphed run replayed its steps, and their losses and top-1 agree (:func:`compare_train_runs`).
    Needs the Fashion-MNIST files; without them the step says so and is skipped."""
    data = _fmnist_dir()
    if data is None:
        return {
            "ok": None,
            "summary": "skipped: no Fashion-MNIST files (set INLINE_ATTN_FMNIST to the folder of the four .gz files)",
        }
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.time()
    procs = {}
    for graphed in (False, True):  # at once: the runs are compared, not timed
        name = "graphed" if graphed else "ungraphed"
        log = open(out / f"train_{name}.log", "w")
        cmd = _train_command(data, out / f"train_{name}", graphed)
        procs[name] = (subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True, env=env), log)
    failed = []
    for name, (proc, log) in procs.items():
        if proc.wait() != 0:
            failed.append(f"{name} run exited {proc.returncode} (train_{name}.log)")
        log.close()
    if failed:
        return {"ok": False, "summary": "inline-attn train: " + "; ".join(failed)}
    plain, graphed = _train_run(out / "train_ungraphed"), _train_run(out / "train_graphed")
    verdict = compare_train_runs(plain, graphed)
    return {**verdict, "ungraphed": plain, "graphed": graphed, "wall_s": round(time.time() - t0, 1)}


def _write(result: dict, out: pathlib.Path, name: str, columns, plot_kw: dict | None) -> str:
    from ..bench.report import format_table, machine_info, plot_sweep, write_results

    result["meta"]["machine"] = machine_info(result["meta"].get("device", "cuda"))
    write_results(result, out, name)
    if plot_kw:
        try:
            plot_sweep(result["rows"], out / f"{name}.png", **plot_kw)
        except Exception as err:  # noqa: BLE001 - a plot is extra
            print(f"plot {name} failed: {err}", file=sys.stderr)
    return format_table(result["rows"], columns)


def step_core(out: pathlib.Path, quick: bool) -> dict:
    """The Triton layer core alone (the custom op's kernels), bf16: achieved bandwidth counted as
    the fewest bytes a fwd+bwd must move (read Q, K, V; write O; read Q, K, V, dO; write dQ, dK,
    dV: 11 B N C elements) over the measured time."""
    from ..bench.report import format_table
    from ..bench.timing import time_interleaved
    from ..ops.fused import triton as tc

    rows = []
    for b, heads, d, side in ((1024, 3, 32, 7), (256, 3, 32, 14), (64, 3, 32, 56), (16, 3, 32, 112)):
        n, c = side * side, heads * d
        q, k, v = torch.randn(b, n, 3 * c, device="cuda", dtype=torch.bfloat16).chunk(3, dim=-1)
        w9 = torch.randn(b, 9, c, device="cuda", dtype=torch.bfloat16)
        g = torch.randn(b, n, c, device="cuda", dtype=torch.bfloat16)
        args = (heads, d**-0.5, side, side, 0)
        t = time_interleaved(
            {
                "fwd": lambda: tc.inline_forward_triton(q, k, v, w9, *args),
                "bwd": lambda: tc.inline_backward_triton(q, k, v, w9, g, *args),
            },
            warmup=3,
            repeats=10,
            device="cuda",
        )
        fwd, bwd = t["fwd"].median, t["bwd"].median
        nbytes = 11 * b * n * c * 2
        chunks, _ = tc._launch_shape(q, b * heads, n, None)
        rows.append(
            {
                "grid": f"{side}x{side}",
                "batch": b,
                "launch": "fused" if chunks == 1 else f"split {chunks}",
                "fwd_ms": fwd * 1e3,
                "bwd_ms": bwd * 1e3,
                "GBps": nbytes / (fwd + bwd) / 1e9,
            }
        )
        q = k = v = w9 = g = None  # free this size's tensors before the next size's
    copy = _copy_bandwidth() / 1e9
    for r in rows:
        r["pct_of_copy"] = 100 * r["GBps"] / copy
    cols = (
        ("grid", "grid", ""),
        ("batch", "B", ""),
        ("launch", "launch", ""),
        ("fwd_ms", "fwd ms", ".3f"),
        ("bwd_ms", "bwd ms", ".3f"),
        ("GBps", "GB/s (min bytes)", ".0f"),
        ("pct_of_copy", "% of copy", ".1f"),
    )
    (out / "core.json").write_text(json.dumps({"copy_GBps": copy, "rows": rows}, indent=1))
    return {
        "ok": True,
        "rows": rows,
        "table": format_table(rows, cols) + f"\ndevice copy: {copy:.0f} GB/s",
        "summary": ", ".join(f"{r['grid']} {r['GBps']:.0f} GB/s" for r in rows),
    }


def _cuda_bf16(*, warmup: int, repeats: int, budget_s: float, memory: bool) -> dict:
    """The timing arguments of every benchmark the steps run (bench_attention's and bench_models'):
    on CUDA under bf16 autocast, with the step's warm-up, rounds, seconds a case and whether the
    peak memory is measured."""
    return dict(device="cuda", amp="bf16", warmup=warmup, repeats=repeats, budget_s=budget_s, memory=memory)


def step_layer(out: pathlib.Path, quick: bool) -> dict:
    from ..bench.attention import LAYER_COLUMNS, bench_attention

    sizes = (7, 14, 56) if quick else (7, 14, 28, 56, 112)
    res = bench_attention(
        sizes=sizes,
        dim=96,
        heads=3,
        token_budget=64 * 56 * 56,
        **_cuda_bf16(warmup=3, repeats=10, budget_s=5.0, memory=True),
    )
    table = _write(
        res,
        out,
        "layer",
        LAYER_COLUMNS,
        dict(
            x="side",
            series="series",
            xlabel="token grid side S (S x S tokens)",
            xticks=list(sizes),
            title="attention layers on CUDA, C=96, 3 heads, bf16 autocast, batch = 200704 tokens / S^2",
            panels=(
                ("median_ms", "latency per batch (ms)", True),
                ("speedup_vs_softmax", "speedup vs SDPA softmax", False),
                ("peak_mib", "peak memory (MiB)", True),
            ),
        ),
    )
    return {"ok": True, "rows": res["rows"], "table": table}


def _models(out: pathlib.Path, name: str, preset: str, values, batch: int, quick: bool) -> dict:
    from ..bench.model import MODEL_COLUMNS, ModelCase, preset_cases

    cases, xlabel = preset_cases(preset, values)
    fused_label = {"window": "InLine-Swin-T", "resolution": "InLine-DeiT-T"}[preset]
    # the authors' code: InLine's eager composition, softmax computed explicitly (N x N weights)
    base_label = {"window": "Swin-T", "resolution": "DeiT-T"}[preset]
    extra = [
        ModelCase(f"{fused_label} eager", c.name, c.resolution, c.x, {**c.overrides, "impl": "eager"})
        for c in cases
        if c.label == fused_label
    ]
    extra += [
        ModelCase(f"{base_label} explicit", c.name, c.resolution, c.x, {**c.overrides, "sdpa": "math"})
        for c in cases
        if c.label == base_label
    ]
    tables, rows = [], []
    for mode in ("infer", "train"):
        res = _bench_bf16(cases + extra, batch=batch, mode=mode, warmup=2, quick=quick)
        rows += res["rows"]
        tables.append(
            f"{mode}:\n"
            + _write(
                res,
                out,
                f"{name}_{mode}",
                MODEL_COLUMNS,
                dict(
                    x="x",
                    series="label",
                    xlabel=xlabel,
                    xticks=list(dict.fromkeys(r["x"] for r in res["rows"])),
                    title=f"{preset} sweep, {mode}, batch {batch}, bf16 autocast, CUDA",
                    panels=(
                        ("throughput", "throughput (img/s)", True),
                        ("speedup", f"speedup vs {res['meta']['baseline']}", False),
                        ("peak_mib", "peak memory (MiB)", True),
                    ),
                ),
            )
        )
    return {"ok": True, "rows": rows, "table": "\n\n".join(tables)}


def _bench_bf16(cases, *, batch: int, mode: str, warmup: int, quick: bool) -> dict:
    """:func:`~inline_attn.bench.model.bench_models` as the model steps run it: CUDA, bf16
    autocast, 5 s a case, peak memory, no MAC count."""
    from ..bench.model import bench_models

    timing = _cuda_bf16(warmup=warmup, repeats=3 if quick else 6, budget_s=5.0, memory=True)
    return bench_models(cases, batch=batch, mode=mode, macs=False, **timing)


def step_window(out: pathlib.Path, quick: bool) -> dict:
    return _models(out, "window", "window", (7, 56) if quick else (7, 14, 28, 56), 64, quick)


def step_resolution(out: pathlib.Path, quick: bool) -> dict:
    return _models(out, "resolution", "resolution", (224, 1024) if quick else (224, 384, 640, 1024), 64, quick)


def step_compile(out: pathlib.Path, quick: bool) -> dict:
    from ..bench.model import MODEL_COLUMNS, ModelCase

    cases = []
    for label, name, ov in (
        ("InLine-Swin-T w7", "inline_swin_tiny", {"window_size": 7}),
        ("InLine-DeiT-T", "inline_deit_tiny", {}),
    ):
        cases.append(ModelCase(label, name, 224, label, dict(ov)))
        cases.append(ModelCase(f"{label} compiled", name, 224, label, {**ov, "compile": 1}))
    rows, tables = [], []
    for case_pair in (cases[:2], cases[2:]):
        res = _bench_bf16(case_pair, batch=64, mode="train", warmup=3, quick=quick)
        rows += res["rows"]
        tables.append(_write(res, out, f"compile_{len(tables)}", MODEL_COLUMNS, None))
    return {"ok": True, "rows": rows, "table": "\n\n".join(tables)}


def device_busy_ms(events) -> float:
    """Milliseconds of device (kernel) time in profiler events: the self device time of the events
    that ran on the GPU. Operator rows, which repeat their kernels' time, are not counted."""
    total_us = 0.0
    for e in events:
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        total_us += getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
    return total_us / 1e3


def step_profile(out: pathlib.Path, quick: bool) -> dict:
    """Where a step's time goes: ``torch.profiler`` of the attention layers (C=96, 3 heads, fwd+bwd)
    and of a training step (forward + backward) of InLine-DeiT-T and DeiT-T, bf16 autocast. Each
    row says how long a step takes (CUDA events, unprofiled) and how much of it the GPU is busy
    (kernel time in the profile): a low share means the step waits on Python and kernel launches,
    which faster kernels cannot fix. The operator tables go to ``profile.txt``."""
    from torch.profiler import ProfilerActivity, profile

    from .. import create_model
    from ..layers import build_attention
    from ..bench.attention import layer_step
    from ..bench.report import format_table
    from ..bench.timing import time_interleaved

    def measure(label, step, n):
        wall_ms = time_interleaved({label: step}, warmup=3, repeats=n, device="cuda")[label].median * 1e3
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                step()
            torch.cuda.synchronize()
        busy_ms = device_busy_ms(prof.events()) / n
        table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=60)
        fh.write(f"\n===== {label}: {wall_ms:.3f} ms per step, GPU busy {busy_ms:.3f} ms\n{table}\n")
        rows.append({"case": label, "step_ms": wall_ms, "gpu_busy_ms": busy_ms, "busy_pct": 100 * busy_ms / wall_ms})

    rows: list[dict] = []
    with open(out / "profile.txt", "w") as fh:
        for side, batch in ((14, 1024),) if quick else ((14, 1024), (56, 64)):
            for kind in ("inline", "linear", "softmax"):
                torch.manual_seed(0)
                layer = build_attention(kind, 96, 3).cuda().eval()
                x = torch.randn(batch, side * side, 96, device="cuda", requires_grad=True)
                step = layer_step(layer, x, (side, side), "fwd+bwd", "", torch.bfloat16)
                measure(f"{kind} layer {side}x{side} B{batch}", step, 5)
        for label, kw in (("InLine-DeiT-T", {}), ("DeiT-T", dict(pattern="S", num_heads=3))):
            model = create_model("inline_deit_tiny", **kw).cuda().train()
            images = torch.randn(64, 3, 224, 224, device="cuda")

            def train_step(model=model, images=images):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(images).float().logsumexp(-1).mean()
                loss.backward()

            measure(f"{label} 224 px B64 fwd+bwd", train_step, 3)
            model = images = None
    cols = (
        ("case", "case", ""),
        ("step_ms", "step ms", ".3f"),
        ("gpu_busy_ms", "GPU busy ms", ".3f"),
        ("busy_pct", "GPU busy %", ".0f"),
    )
    (out / "profile.json").write_text(json.dumps({"rows": rows}, indent=1))
    summary = ", ".join(f"{r['case']} {r['busy_pct']:.0f} %" for r in rows)
    return {"ok": True, "rows": rows, "summary": f"GPU busy share: {summary}", "table": format_table(rows, cols)}


def sdpa_backend(step) -> str:
    """Which SDPA backend a step's softmax ran (flash, cudnn, efficient or math), from the names
    of the kernels in one profiled call."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    names = " ".join(e.name.lower() for e in prof.events())
    for backend, marks in (("cudnn", ("cudnn",)), ("flash", ("flash",)), ("efficient", ("fmha", "efficient"))):
        if any(m in names for m in marks):
            return backend
    return "math"


def _eager_and_graphed(run) -> list[dict]:
    """The rows of ``run(graphed)`` for graphed False and True, each marked with whether its steps
    were captured (False where the benchmark fell back)."""
    rows = []
    for graphed in (False, True):
        res = run(graphed)
        for r in res["rows"]:
            r["graphed"] = graphed and res["meta"]["why_not_graphed"] is None
        rows += res["rows"]
    return rows


def step_graphs(out: pathlib.Path, quick: bool) -> dict:
    """The same mode on both sides, eager and CUDA-graphed (:mod:`inline_attn.runtime.graphs`): the
    attention layers fwd+bwd (14 x 14, B 1024 and 56 x 56, B 64; C 96, 3 heads, bf16 autocast):
    InLine fused, softmax through SDPA (PyTorch's choice, with the backend that ran, and flash /
    cuDNN held where they run), softmax explicit (the authors'); and a training step (fwd+bwd) of
    InLine-DeiT-T and DeiT-T at 224 px, batch 128 (the recipes' per-GPU batch). Each case has its
    own time budget, so the step stays within STEP_SECONDS."""
    from ..layers import build_attention
    from ..bench.attention import LAYER_COLUMNS, bench_attention, layer_step
    from ..bench.model import MODEL_COLUMNS, bench_models, preset_cases
    from ..bench.report import format_table

    tables = []
    kinds = ("inline", "softmax", "softmax-flash", "softmax-cudnn", "softmax-math")
    layer_rows = _eager_and_graphed(
        lambda graphed: bench_attention(
            sizes=(14, 56),
            kinds=kinds,
            token_budget=64 * 56 * 56,
            modes=("fwd+bwd",),
            cuda_graphs=graphed,
            **_cuda_bf16(warmup=3, repeats=5, budget_s=0.5, memory=False),
        )
    )
    backends = {}
    for side, batch in ((14, 1024), (56, 64)):
        layer = build_attention("softmax", 96, 3).cuda().eval()
        x = torch.randn(batch, side * side, 96, device="cuda", requires_grad=True)
        backends[f"{side}x{side}"] = sdpa_backend(layer_step(layer, x, (side, side), "fwd+bwd", "", torch.bfloat16))
    for r in layer_rows:
        if r["kind"] == "softmax":
            r["sdpa_backend"] = backends.get(r["grid"], "")
    cases, _ = preset_cases("resolution", (224,))
    model_rows = _eager_and_graphed(
        lambda graphed: bench_models(
            cases,
            batch=128,
            mode="train",
            macs=False,
            cuda_graphs=graphed,
            **_cuda_bf16(warmup=2, repeats=3, budget_s=1.0, memory=False),
        )
    )
    layer_cols = (("graphed", "graphed", ""), *LAYER_COLUMNS, ("sdpa_backend", "SDPA backend", ""))
    tables.append(format_table(layer_rows, layer_cols))
    tables.append(format_table(model_rows, (("graphed", "graphed", ""), *MODEL_COLUMNS)))
    (out / "graphs.json").write_text(json.dumps({"layer": layer_rows, "model": model_rows}, indent=1, default=str))
    return {
        "ok": True,
        "rows": layer_rows,
        "model_rows": model_rows,
        "table": "\n\n".join(tables),
        "summary": f"SDPA backend (PyTorch's choice): {backends}",
    }


# The autotune sweep's candidates and shapes: (tokens per sample, head dim, heads, batch) as the
# paper's models run them (Swin / PVT windows with head dim 32, DeiT-T's 14 x 14 with 64, large grids).
AUTOTUNE_TILINGS = [(bn, w) for bn in (32, 64, 128) for w in (2, 4, 8)]
AUTOTUNE_SHAPES = [(49, 32, 3, 4096), (196, 32, 3, 1024), (196, 64, 3, 256), (3136, 32, 3, 64), (3136, 64, 3, 16)]


def pick_winners(timings: dict, device_name: str, dtype: torch.dtype = torch.bfloat16) -> dict:
    """{(n, d, heads): {(BLOCK_N, warps): seconds, "default": seconds}} -> the tuning table's
    winners ``{key: {"BLOCK_N", "num_warps", "ms", "default_ms"}}`` (the fastest candidate; shapes
    with no timed candidate are left out)."""
    from ..ops.fused.triton import tuning_key

    winners = {}
    for (n, d, heads), by_tiling in timings.items():
        timed = {t: v for t, v in by_tiling.items() if t != "default" and math.isfinite(v)}
        if not timed:
            continue
        (block_n, warps), best = min(timed.items(), key=lambda kv: kv[1])
        winners[tuning_key(device_name, n, d, heads, dtype)] = {
            "BLOCK_N": block_n,
            "num_warps": warps,
            "ms": round(best * 1e3, 4),
            "default_ms": round(by_tiling.get("default", math.nan) * 1e3, 4),
        }
    return winners


def step_autotune(out: pathlib.Path, quick: bool, budget_s: float = 110.0) -> dict:
    """Sweep the Triton core's tile rows and warps (:data:`AUTOTUNE_TILINGS`) over
    :data:`AUTOTUNE_SHAPES` (fwd+bwd, bf16) and write the winners per (GPU, token bucket, head dim,
    heads, dtype), merged with the committed table, to ``triton_tuning.json``: copy it to
    ``src/inline_attn/ops/fused/`` for later runs to read without re-tuning. Stops at its own
    budget; shapes not reached keep the committed entries."""
    from ..ops.fused import triton as tc
    from ..bench.timing import time_interleaved

    deadline = time.time() + budget_s
    name = torch.cuda.get_device_name(0)
    timings: dict = {}
    for n, d, heads, b in AUTOTUNE_SHAPES[:2] if quick else AUTOTUNE_SHAPES:
        if time.time() > deadline:
            break
        c = heads * d
        side = int(math.isqrt(n))
        q, k, v = torch.randn(b, n, 3 * c, device="cuda", dtype=torch.bfloat16).chunk(3, dim=-1)
        w9 = torch.randn(b, 9, c, device="cuda", dtype=torch.float32)
        g = torch.randn(b, n, c, device="cuda", dtype=torch.bfloat16)
        args = (heads, d**-0.5, side, side, 0)

        def fwd_bwd():
            tc.inline_forward_triton(q, k, v, w9, *args)
            tc.inline_backward_triton(q, k, v, w9, g, *args)

        by_tiling = {"default": time_interleaved({"d": fwd_bwd}, warmup=2, repeats=5, device="cuda")["d"].median}
        for tiling in AUTOTUNE_TILINGS:
            if time.time() > deadline:
                break
            try:
                with tc.forced_tiling(*tiling):
                    by_tiling[tiling] = time_interleaved({"t": fwd_bwd}, warmup=2, repeats=5, device="cuda")["t"].median
            except Exception:  # noqa: BLE001 - a tiling the compiler refuses (registers, shared memory) loses
                by_tiling[tiling] = math.inf
        timings[(n, d, heads)] = by_tiling
        q = k = v = w9 = g = None
    winners = pick_winners(timings, name)
    committed = json.loads(tc.TUNING_FILE.read_text()) if tc.TUNING_FILE.is_file() else {"winners": {}}
    table = {**committed, "winners": {**committed.get("winners", {}), **winners}}
    (out / "triton_tuning.json").write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    gains = [f"{k.split('|', 1)[1]}: {w['default_ms'] / w['ms']:.2f}x" for k, w in winners.items() if w["ms"] > 0]
    return {
        "ok": bool(winners),
        "winners": winners,
        "summary": f"{len(winners)} of {len(AUTOTUNE_SHAPES)} shapes tuned on {name} (triton_tuning.json; "
        f"gain over the defaults {', '.join(gains)})",
    }


def _goal_row(what: str, value: float, goal: float, unit: str = "x", mode: str = "eager") -> list[str]:
    if math.isnan(value):
        return [what, mode, "not measured", f">= {goal:g}{unit}", "-"]
    shown = f"{value:.2f}{unit}" if unit == "x" else f"{value:.0f}{unit}"
    return [what, mode, shown, f">= {goal:g}{unit}", "pass" if value >= goal else "FAIL"]


def goal_table(results: dict, device: str) -> str:
    """Issue 23's goal table, one row per goal and mode (the same mode on both sides), pass / FAIL
    against the measured value on ``device``."""
    table = []
    res = results.get("resolution", {}).get("rows", [])
    win = results.get("window", {}).get("rows", [])
    graphs = results.get("graphs", {})
    for px, goal in ((224, 1.0), (1024, 2.5)):
        v = _ratio(res, px, "InLine-DeiT-T", "DeiT-T", mode="train")
        table.append(_goal_row(f"InLine-DeiT-T / DeiT-T training, {px} px (B 64)", v, goal))
    for graphed in (False, True):
        rows = [r for r in graphs.get("model_rows", []) if r.get("graphed") == graphed]
        v = _ratio(rows, 224, "InLine-DeiT-T", "DeiT-T")
        table.append(_goal_row("InLine-DeiT-T / DeiT-T training, 224 px (B 128)", v, 1.0, mode=_mode(graphed)))
    for w, goal in ((7, 1.15), (56, 4.0)):
        v = _ratio(win, w, "InLine-Swin-T", "Swin-T", mode="train")
        table.append(_goal_row(f"InLine-Swin-T / Swin-T training, window {w}", v, goal))
    layer = results.get("layer", {}).get("rows", [])
    for side, goal in ((14, 1.0), (56, 3.0)):
        for mode, rows in (("eager", layer), *((_mode(g), _graph_rows(graphs, g)) for g in (False, True))):
            r = next((r for r in rows if r["side"] == side and r["kind"] == "inline" and r["mode"] == "fwd+bwd"), None)
            v = r["speedup_vs_softmax"] if r else math.nan
            table.append(_goal_row(f"layer fwd+bwd / SDPA, {side}x{side}", v, goal, mode=mode))
    prof = results.get("profile", {}).get("rows", [])
    r = next((r for r in prof if r["case"].startswith("inline layer 56x56")), None)
    busy = r["busy_pct"] if r else math.nan
    table.append(_goal_row("GPU-busy share of the InLine layer step, 56x56", busy, 85, " %"))
    r = next((r for r in results.get("core", {}).get("rows", []) if r["grid"] == "56x56"), None)
    table.append(
        _goal_row("Triton core fwd+bwd at 56x56, share of copy", r["pct_of_copy"] if r else math.nan, 40, " %")
    )
    columns = ["what", "mode", "measured", "goal", "verdict"]
    return "\n".join([f"Goals of issue 23 on {device} (bf16):", "", *markdown_table(table, columns)])


def _mode(graphed: bool) -> str:
    return "graphed" if graphed else "eager (graphs step)"


def _graph_rows(graphs: dict, graphed: bool) -> list[dict]:
    return [r for r in graphs.get("rows", []) if r.get("graphed") == graphed]


# steps that run only when named in --steps (each within its own budget); the default run is STEPS
ON_DEMAND_STEPS = {"autotune": step_autotune}
ON_DEMAND_SECONDS = {"autotune": 120}


def all_steps() -> dict:
    """Every step in the order they run: the benchmarks, the on-demand ones, the tests last."""
    bench = {k: v for k, v in STEPS.items() if k != "tests"}
    return {**bench, **ON_DEMAND_STEPS, "tests": STEPS["tests"]}


STEPS = {
    "train": step_train,
    "core": step_core,
    "layer": step_layer,
    "window": step_window,
    "resolution": step_resolution,
    "compile": step_compile,
    "profile": step_profile,
    "graphs": step_graphs,
    "tests": step_tests,
}


def plan_step(name: str, seconds_left: float) -> tuple[bool, dict]:
    """Whether step ``name`` is started with ``seconds_left`` of the budget, and its keyword
    arguments (the tests' time box is what is left)."""
    if name == "tests":
        return seconds_left >= TESTS_MIN_S, {"timeout_s": seconds_left}
    if name in ON_DEMAND_SECONDS:
        usual = ON_DEMAND_SECONDS[name]
        return seconds_left >= usual, {"budget_s": usual - 10}
    return seconds_left >= STEP_SECONDS[name], {}


def _ratio(rows, x, label, base, key="throughput", mode=None):
    def pick(lbl):
        return next(
            (r for r in rows if r.get("x") == x and r.get("label") == lbl and (mode is None or r.get("mode") == mode)),
            None,
        )

    a, b = pick(label), pick(base)
    return a[key] / b[key] if a and b and b[key] else math.nan


def goals(results: dict, copy_bw: float) -> list[str]:
    """The issue's performance goals, each with the measured value."""
    lines = []
    for r in results.get("core", {}).get("rows", []):
        if r["grid"] in ("56x56", "112x112"):
            lines.append(
                f"Triton core fwd+bwd at {r['grid']}: {r['GBps']:.0f} GB/s = {r['pct_of_copy']:.0f} % of the "
                f"device copy rate (goal >= 60 %) {'met' if r['pct_of_copy'] >= 60 else 'MISSED'}"
            )
    layer = results.get("layer", {}).get("rows", [])

    def layer_row(side, kind, mode):
        return next((r for r in layer if r["side"] == side and r["kind"] == kind and r["mode"] == mode), None)

    for side, target in ((14, 1.0), (56, 4.0)):
        r = layer_row(side, "inline", "fwd+bwd")
        if r:
            v = r["speedup_vs_softmax"]
            lines.append(
                f"layer fwd+bwd vs SDPA at {side}x{side}: {v:.2f}x (goal >= {target}x) "
                f"{'met' if v >= target else 'MISSED'}"
            )
    win = results.get("window", {}).get("rows", [])
    v = _ratio(win, 7, "InLine-Swin-T", "Swin-T", mode="train")
    if not math.isnan(v):
        lines.append(
            f"InLine-Swin-T training throughput vs Swin-T at window 7: {v:.2f}x (goal >= 1.0x) "
            f"{'met' if v >= 1.0 else 'MISSED'}"
        )
    res = results.get("resolution", {}).get("rows", [])
    for mode in ("infer", "train"):
        v = _ratio(res, 1024, "InLine-DeiT-T", "DeiT-T", mode=mode)
        if not math.isnan(v):
            lines.append(
                f"InLine-DeiT-T vs DeiT-T (SDPA) at 1024 px ({mode}): {v:.2f}x (goal >= 2.5x) "
                f"{'met' if v >= 2.5 else 'MISSED'}"
            )
        v = _ratio(res, 1024, "InLine-DeiT-T", "DeiT-T explicit", mode=mode)
        if not math.isnan(v):
            lines.append(
                f"InLine-DeiT-T vs DeiT-T with explicit softmax (the authors' code) at 1024 px ({mode}): {v:.2f}x"
            )
    comp = results.get("compile", {}).get("rows", [])
    for label in ("InLine-Swin-T w7", "InLine-DeiT-T"):
        v = _ratio(comp, label, f"{label} compiled", label)
        if not math.isnan(v):
            verdict = "met" if v >= 1.5 else "MISSED"
            lines.append(f"{label} training, compiled vs eager: {v:.2f}x (goal >= 1.5x) {verdict}")
    return lines


def write_summary(out: pathlib.Path, env: dict, results: dict, goal_lines: list[str], argv: list[str]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    keys = ("device", "sms", "memory_gib", "driver", "cuda", "torch", "triton", "python", "copy_GBps")
    lines = ["# GPU check", "", f"`{' '.join(['make gpu-check'] + argv)}` on {when}", ""]
    lines += markdown_table([[k, env.get(k)] for k in keys], ["", ""])
    steps = []
    for name, r in results.items():
        mark = {True: "pass", False: "FAIL", None: "skipped"}[r.get("ok")]
        steps.append([name, mark, f"{r.get('seconds', 0):.0f}", r.get("summary", "").replace("|", "/")])
    lines += ["", "## Steps", "", *markdown_table(steps, ["step", "result", "seconds", "summary"])]
    lines += ["", "## Performance goals", ""] + [f"- {g}" for g in goal_lines]
    lines += ["", goal_table(results, env.get("device", "unknown device"))]
    for name in ("core", "layer", "window", "resolution", "compile", "profile", "graphs"):
        if results.get(name, {}).get("table"):
            lines += ["", f"## {name}", "", "```", results[name]["table"], "```"]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


def save_results(out: pathlib.Path, env: dict, results: dict, argv: list[str]) -> str:
    """Write ``summary.md`` and ``gpu_check.json`` for the steps run so far; returns the summary."""
    goal_lines = goals(results, env["copy_GBps"])
    text = write_summary(out, env, results, goal_lines, argv)
    (out / "gpu_check.json").write_text(
        json.dumps(
            {
                "env": env,
                "goals": goal_lines,
                "results": {k: {kk: vv for kk, vv in v.items() if kk != "table"} for k, v in results.items()},
            },
            indent=1,
            default=str,
        )
    )
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_check_results", help="output folder (default gpu_check_results)")
    parser.add_argument(
        "--steps", nargs="+", default=list(STEPS), choices=list(all_steps()), help="default: all but autotune"
    )
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats (a smoke run of the check)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=BUDGET_S,
        help=f"seconds for all steps (default {BUDGET_S:.0f}); a step that no longer fits is not started, "
        "and the tests get what is left",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "gpu-check: no CUDA device here. It runs on a machine with an NVIDIA GPU, a CUDA build of PyTorch "
            "and triton (python3 there, with the project on PYTHONPATH=src).",
            file=sys.stderr,
        )
        return 2
    os.environ.pop("TRITON_INTERPRET", None)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = _versions()
    env["copy_GBps"] = round(_copy_bandwidth() / 1e9)
    print(
        f"gpu-check on {env['device']} (driver {env['driver']}, torch {env['torch']}, triton {env['triton']})",
        flush=True,
    )
    results: dict = {}
    text = save_results(out, env, results, argv or sys.argv[1:])
    deadline = time.time() + args.budget_s
    for name in sorted(set(args.steps), key=list(all_steps()).index):  # each step once, in the check's order
        t0 = time.time()
        start, kwargs = plan_step(name, deadline - t0)
        if not start:
            results[name] = {
                "ok": None,
                "seconds": 0.0,
                "summary": f"not started: {max(deadline - t0, 0):.0f} s of the {args.budget_s:.0f} s budget left",
            }
            print(f"   {name}: {results[name]['summary']}", flush=True)
            text = save_results(out, env, results, argv or sys.argv[1:])
            continue
        print(f"== {name}", flush=True)
        try:
            r = all_steps()[name](out, args.quick, **kwargs)
        except Exception as err:  # noqa: BLE001 - record and go on with the other steps
            r = {"ok": False, "summary": f"{type(err).__name__}: {err}"[:400]}
            (out / f"{name}.error.txt").write_text(traceback.format_exc())
        r["seconds"] = time.time() - t0
        results[name] = r
        print(f"   {name}: {r.get('summary', 'done')} ({r['seconds']:.0f} s)", flush=True)
        # after every step, so a run stopped by a time limit still leaves what it measured
        text = save_results(out, env, results, argv or sys.argv[1:])
    with tarfile.open(out.with_suffix(".tar.gz") if out.suffix == "" else out / "gpu_check.tar.gz", "w:gz") as tar:
        tar.add(out, arcname=out.name)
    print(text)
    return 0 if all(r.get("ok") is not False for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
