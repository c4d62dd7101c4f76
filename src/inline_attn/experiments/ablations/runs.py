"""Running the grid: train every (setting, seed) of the plan that has no result yet, measure, and
tabulate whatever is finished into ``OUTPUT/report.md`` (:func:`run_ablations`)."""

from __future__ import annotations

import pathlib
import time
from dataclasses import asdict
from typing import Optional

from ..._io import atomic_write_text, read_json
from ...runtime.output import claim_output
from ...runtime.report import write_json
from ...train.config import Config, configs_dir
from .measure import load_average, measure_runs
from .plot import plot_accuracy_vs_runtime
from .report import render
from .settings import ABLATION_CONFIG, PARTS, PRESETS, Budget, Setting, plan

# what shows that an output folder holds ablation runs: their results, the log of earlier
# invocations, a run stopped part-way (``<setting>/seed<N>/last.pth``)
ABLATION_RUN_FILES = ("results/*.json", "invocations.json", "*/seed*/last.pth")
REPORT = "report.md"  # the report, in the output folder (its figure in figures/ beside it)


def _budget_overrides(setting: Setting, budget: Budget) -> list[tuple]:
    if setting.config == ABLATION_CONFIG:
        ov = [("data.subset", budget.subset), ("data.val_subset", budget.val_subset), ("sched.epochs", budget.epochs)]
        return ov + list(budget.overrides)
    ov = [("data.subset", budget.fmnist_subset), ("data.val_subset", budget.val_subset)]
    return ov + ([("sched.epochs", budget.fmnist_epochs)] if budget.fmnist_epochs else []) + list(budget.overrides)


def run_one(
    setting: Setting, seed: int, budget: Budget, output: pathlib.Path, config_dir: pathlib.Path
) -> Optional[dict]:
    """Train (or finish) one run and return its record; the trainer's summary (``stopped`` set)
    when a signal stopped it."""
    from ...train.task import train

    run_dir = output / setting.key / f"seed{seed}"
    ov = list(setting.overrides) + _budget_overrides(setting, budget)
    ov += [("train.seed", seed), ("train.output", str(run_dir)), ("train.resume", "auto")]
    cfg = Config.load(config_dir / setting.config, ov)
    load_before = load_average()
    base = {"setting": setting.key, "label": setting.label, "kind": setting.kind, "seed": seed}
    try:
        summary = train(cfg)
    except FloatingPointError as e:  # a diverged run is a result (e.g. linear attention, identity kernel)
        return {**base, "top1": None, "diverged": str(e), "budget": asdict(budget), "load_before": load_before}
    if summary.get("stopped"):
        return summary
    summary = read_json(run_dir / "summary.json")
    return {
        **base,
        "top1": summary["final"]["val_top1"],
        "params": summary["params"],
        "macs": summary.get("macs"),
        "train_img_s": summary["train_img_s"],
        "train_time_s": summary.get("train_time_s"),
        "epochs": summary["epochs_done"],
        "budget": asdict(budget),
        "overrides": [list(o) for o in ov],
        "load_before": load_before,
        "load_after": load_average(),
        "finished_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def _train_missing(todo, budget: Budget, out: pathlib.Path, cdir: pathlib.Path, max_runs: int, progress: bool):
    """Train the runs of ``todo`` without a result in ``out/results`` (at most ``max_runs``, 0: all);
    returns (trained now, found finished, the summary of the run a signal stopped, else None)."""
    from tqdm import tqdm

    trained = skipped = 0
    bar = tqdm(todo, desc="ablation runs", unit="run", disable=not progress)
    for setting, seed in bar:
        path = out / "results" / f"{setting.key}__seed{seed}.json"
        if path.is_file():
            skipped += 1
            continue
        if max_runs and trained >= max_runs:
            continue
        bar.set_postfix_str(f"{setting.key} seed {seed}")
        rec = run_one(setting, seed, budget, out, cdir)
        if rec.get("stopped"):
            return trained, skipped, rec
        write_json(rec, path)
        trained += 1
    return trained, skipped, None


def run_ablations(
    preset: str = "full",
    *,
    output: Optional[str] = None,
    parts: str = PARTS,
    seeds: int = 3,
    max_runs: int = 0,
    config_dir: Optional[str] = None,
    budget: Optional[Budget] = None,
    progress: bool = True,
    report_only: bool = False,
    resume: Optional[str] = None,
    overwrite: bool = False,
) -> dict:
    """Train what is missing, then tabulate whatever is finished into ``output/report.md`` (part f's
    figure into ``output/figures/``).

    Args:
        preset: "full", "quick" or "gpu" (:data:`PRESETS`); ``budget`` replaces its budget (tests).
        output: run folder (default ``runs/ablations/<preset>``).
        parts: letters of :data:`PARTS`.
        seeds: seeds 0 .. seeds-1 per setting (>= 3 for the mean +- std the tables report).
        max_runs: stop after training this many runs (0: no limit); the rest stays for later.
        report_only: train nothing; measure and tabulate the finished runs.
        resume: "auto" continues the runs in ``output``: a folder holding finished or stopped runs
            is refused without it (or ``overwrite``, which moves them into a subfolder), as
            :func:`~inline_attn.runtime.output.claim_output` refuses for every task.

    Returns {"trained": runs trained now, "skipped": runs found finished, "left": runs still to
    train, "stopped": True when a signal stopped a run, "signal": its number (else None), "report":
    the markdown}.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: expected one of {tuple(PRESETS)}")
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    if max_runs < 0:
        raise ValueError(f"max_runs must be >= 0 (0: no limit), got {max_runs}")
    budget = budget or PRESETS[preset]
    out = pathlib.Path(output or f"runs/ablations/{preset}")
    res_dir = out / "results"
    if report_only and overwrite:
        raise ValueError("--report-only tabulates the runs in --output: it cannot go with --overwrite (replacing them)")
    if report_only and not any(res_dir.glob("*.json")):
        # a mistyped --output would otherwise report "Runs finished: 0"
        raise ValueError(f"--report-only: no finished runs in {res_dir} (is --output the run folder?)")
    cdir = pathlib.Path(config_dir) if config_dir else configs_dir()
    t0 = time.time()
    todo = plan(parts, range(seeds))
    if report_only:
        done = [1 for s, sd in todo if (res_dir / f"{s.key}__seed{sd}.json").is_file()]
        trained, skipped, stopped = 0, len(done), None
    else:
        with claim_output(out, resume=resume, overwrite=overwrite, run_files=ABLATION_RUN_FILES):
            trained, skipped, stopped = _train_missing(todo, budget, out, cdir, max_runs, progress)
    left = sum(1 for s, sd in todo if not (res_dir / f"{s.key}__seed{sd}.json").is_file())
    results = _read(res_dir, todo)
    extras = {} if stopped else measure_runs(parts, results, budget, out, cdir, seeds, progress)
    wall = time.time() - t0
    if trained:
        log_invocation(out, t0, wall, trained)
    report = render(preset, parts, seeds, results, extras, budget, wall, left, max_runs, _invocations(out))
    atomic_write_text(out / REPORT, report)
    if "f" in parts and not stopped:
        plot_accuracy_vs_runtime(results, extras.get("bench", {}), out / "figures", preset)
    signal = stopped.get("signal") if stopped else None
    return {
        "trained": trained,
        "skipped": skipped,
        "left": left,
        "stopped": bool(stopped),
        "signal": signal,
        "report": report,
    }


def log_invocation(out: pathlib.Path, t0: float, wall: float, trained: int) -> None:
    """Append this invocation (start, wall time, runs trained, load) to ``out/invocations.json``."""
    rec = {
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0)),
        "wall_s": round(wall, 1),
        "runs_trained": trained,
        "load_at_end": load_average(),
    }
    write_json({"invocations": _invocations(out) + [rec]}, out / "invocations.json")


def _invocations(out: pathlib.Path) -> list[dict]:
    path = out / "invocations.json"
    return read_json(path)["invocations"] if path.is_file() else []


def _read(res_dir: pathlib.Path, todo) -> dict[str, list[dict]]:
    """setting key -> its finished runs' records."""
    by: dict[str, list[dict]] = {}
    for s, seed in todo:
        p = res_dir / f"{s.key}__seed{seed}.json"
        if p.is_file():
            by.setdefault(s.key, []).append(read_json(p))
    return by
