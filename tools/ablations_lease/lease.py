"""The lease preset: parts a-d of the ablations, 3 seeds, 2 epochs of all 60,000 images a run, on one GPU lease.

``python -m tools.ablations_lease.lease --output DIR`` (``make ablations-lease
ABLATIONS_OUT=$OUT`` on a GPU machine) trains the runs of :func:`lease_plan` in one process with
:class:`~.resident.ResidentRun` (data on the device, the whole step CUDA-graphed), chunk by chunk
in the order of :data:`CHUNKS` (part d, then a, then b and c: the comparisons the reproduction
decided against the paper first), and stops starting runs when the next would pass ``--budget-s``
of wall time. Each finished run is one JSON record, written at once into its chunk's file
(``lease-<n>-<parts>.json``, rewritten atomically), so a lease that ends early loses at most the
run in flight and the results come back in :data:`CHUNKS` files plus ``lease-log.json``. A later
lease continues: ``--resume-from`` names the folder where the returned files were committed, and
the runs recorded there are not trained again (their records are carried into ``--output``).

``--dry-run`` prints the plan, what is finished and the estimated time of each chunk
(:func:`estimate_s`) and trains nothing.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import pathlib
import platform
import sys
import time
from dataclasses import asdict
from typing import Callable, Optional, Sequence

import torch

from tools.files import atomic_write_text, read_json
from inline_attn.data.fmnist import DEFAULT_FMNIST_DIR, INSTALL_HINT
from inline_attn.train.config import Config, configs_dir
from inline_attn.experiments.ablations import ABLATION_CONFIG, Budget, Setting, part_settings, unique

# 2 epochs of the 60,000 training images (10x the full preset's images a run), batch 256 as the
# GPU preset (the recipe scales the lr: base_lr x 256 / 512), the 10,000 test images
LEASE = Budget(0, 0, 2, 0, 0, 0, 0, 0, overrides=(("data.batch_size", 256),))
CHUNKS = ("d", "a", "bc")  # by value: the claims decided against the paper first
SEEDS = 3
LOG = "lease-log.json"
# the estimate (docs/reproduction.md, "The lease preset"): each setting's graphed step at batch 256
# from its launch counts (launches.py; docs/results/ablations/lease/launches.json, STEP_MS where a setting
# is not there), the process's start-up (CUDA, the Triton kernels' first compiles), and a run's
# model, capture and curve evaluations (24,000 test images: 7 points on 2,000, the last on 10,000)
LAUNCHES = "docs/results/ablations/lease/launches.json"
STEP_MS = {"H100": 8.0, "H200": 6.5}  # the mean of the settings' estimates in LAUNCHES
STARTUP_S = 60.0
RUN_OVERHEAD_S = 1.5
STEPS = 2 * (60000 // 256)
MAX_FAILURES_IN_A_ROW = 3  # a run that raises is logged and skipped; this many in a row end the lease


@functools.cache
def estimated_step_ms() -> dict:
    """{setting key: {device: estimated graphed step ms}} from :data:`LAUNCHES` ({} without the file)."""
    path = configs_dir().parent / LAUNCHES
    if not path.is_file():
        return {}
    return {k: v["est_ms"] for k, v in read_json(path)["settings"].items()}


def estimate_s(setting: Setting, device: str = "H100") -> float:
    """Seconds of one lease run of ``setting`` on ``device`` ("H100" | "H200"), start-up left out."""
    step_ms = estimated_step_ms().get(setting.key, STEP_MS)[device]
    return STEPS * step_ms / 1000.0 + RUN_OVERHEAD_S


def chunk_file(i: int, parts: str) -> str:
    return f"lease-{i + 1}-{parts}.json"


def run_id(setting: Setting, seed: int) -> str:
    return f"{setting.key}__seed{seed}"


def lease_plan(seeds: int = SEEDS, chunks: Sequence[str] = CHUNKS) -> list[tuple[str, Setting, int]]:
    """(chunk file, setting, seed) of every run, chunk by chunk; a setting shared by two parts is
    trained once, in the first chunk that needs it, every seed of it before the next setting."""
    out, seen = [], set()
    for i, parts in enumerate(chunks):
        for s in unique(s for p in parts for s in part_settings(p)):
            if s.key not in seen:
                seen.add(s.key)
                out += [(chunk_file(i, parts), s, seed) for seed in range(seeds)]
    return out


def read_records(folders: Sequence[pathlib.Path]) -> dict[str, dict]:
    """{run id: record} of the chunk files in ``folders`` (later folders win; missing ones are empty)."""
    found: dict[str, dict] = {}
    for folder in folders:
        for path in sorted(pathlib.Path(folder).glob("lease-[0-9]*-*.json")):
            found.update(read_json(path).get("runs", {}))
    return found


def write_chunk(out: pathlib.Path, name: str, records: dict[str, dict]) -> None:
    """The chunk file ``name`` in ``out`` with the records whose runs belong to it, atomically."""
    body = {"preset": "lease", "budget": LEASE.describe(), "runs": records}
    atomic_write_text(out / name, json.dumps(body, indent=1, sort_keys=True) + "\n")


def describe_plan(plan, done: dict) -> str:
    """The plan by chunk: runs, finished, the estimated minutes of the rest on an H100 and an H200."""
    lines, total = [f"lease plan ({LEASE.describe()}; estimated minutes on an H100 / an H200)"], [STARTUP_S] * 2
    for name in dict.fromkeys(c for c, _, _ in plan):
        runs = [(s, sd) for c, s, sd in plan if c == name]
        todo = [s for s, sd in runs if run_id(s, sd) not in done]
        est = [sum(estimate_s(s, device) for s in todo) for device in ("H100", "H200")]
        total = [t + e for t, e in zip(total, est)]
        lines.append(
            f"  {name}: {len(runs)} runs, {len(runs) - len(todo)} finished, {len(todo)} to train, "
            f"~{est[0] / 60:.1f} / {est[1] / 60:.1f} min"
        )
    lines.append(
        f"  all that is left, with ~{STARTUP_S:.0f} s of start-up: ~{total[0] / 60:.1f} / {total[1] / 60:.1f} min"
    )
    return "\n".join(lines)


def find_fmnist(path=None) -> pathlib.Path:
    """The Fashion-MNIST folder: ``path``, else ``$INLINE_ATTN_FMNIST``, the Debian package's folder,
    or ``data/fashion-mnist`` in the checkout (a GPU machine gets it carried there); a ValueError
    naming the places looked at, before any GPU work, when none holds the files."""
    places = [path] if path else [os.environ.get("INLINE_ATTN_FMNIST"), DEFAULT_FMNIST_DIR]
    places += [] if path else [str(configs_dir().parent / "data" / "fashion-mnist")]
    for place in filter(None, places):
        if (pathlib.Path(place) / "train-images-idx3-ubyte.gz").is_file() or (
            pathlib.Path(place) / "train-images-idx3-ubyte"
        ).is_file():
            return pathlib.Path(place)
    raise ValueError(
        f"no Fashion-MNIST files (train-images-idx3-ubyte[.gz]) in {[p for p in places if p]}: {INSTALL_HINT}"
    )


def run_config(setting: Setting, seed: int, budget: Budget, data_path, overrides: Sequence[tuple] = ()) -> Config:
    """The config of one lease run: the setting's, the budget's, the seed; ``overrides`` last (the tests')."""
    ov = [*setting.overrides, ("data.subset", budget.subset), ("data.val_subset", budget.val_subset)]
    ov += [("sched.epochs", budget.epochs), *budget.overrides, ("train.seed", seed)]
    ov += [("data.path", str(data_path))] if data_path else []
    return Config.load(configs_dir() / ABLATION_CONFIG, [*ov, *overrides])


def _record(setting: Setting, seed: int, cfg: Config, numbers: dict, macs, budget: Budget) -> dict:
    """A run's record: the keys of the CPU presets' records (``run_one``) and the resident run's numbers."""
    return {
        "setting": setting.key,
        "label": setting.label,
        "kind": setting.kind,
        "seed": seed,
        **numbers,
        "macs": macs,
        "train_time_s": round(sum(numbers["seconds"].values()), 2),
        "epochs": cfg.sched.epochs,
        "budget": asdict(budget),
        "finished_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def _expected_s(setting: Setting, done: list[tuple[Setting, float]], device: torch.device) -> float:
    """The next run's seconds: the mean of this process's runs of ``setting``, else its estimate
    scaled by how this process's runs compared with theirs."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    kind = "H200" if "H200" in name else "H100"
    same = [t for s, t in done if s.key == setting.key]
    if same:
        return sum(same) / len(same)
    scale = sum(t for _, t in done) / sum(estimate_s(s, kind) for s, _ in done) if done else 1.0
    return scale * estimate_s(setting, kind)


def _write_all(out: pathlib.Path, plan, records: dict) -> None:
    for name in dict.fromkeys(c for c, _, _ in plan):
        mine = {run_id(s, sd): records[run_id(s, sd)] for c, s, sd in plan if c == name and run_id(s, sd) in records}
        write_chunk(out, name, mine)


def _log_invocation(out: pathlib.Path, entry: dict) -> None:
    path = out / LOG
    log = read_json(path) if path.is_file() else {"invocations": []}
    log["invocations"].append(entry)
    atomic_write_text(path, json.dumps(log, indent=1) + "\n")


def _free(device: torch.device) -> None:
    gc.collect()  # the run's graphs and their memory pools go with it
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _carry_log(out: pathlib.Path, resume_from: Sequence[pathlib.Path]) -> None:
    """The earlier leases' invocations, from ``resume_from``, into ``out``'s log (each once)."""
    entries = []
    for folder in [*resume_from, out]:
        path = pathlib.Path(folder) / LOG
        if path.is_file():
            entries += [e for e in read_json(path)["invocations"] if e not in entries]
    if entries:
        atomic_write_text(out / LOG, json.dumps({"invocations": entries}, indent=1) + "\n")


def run_lease(
    output,
    *,
    device: str = "cuda",
    data_path=None,
    budget_s: float = 450.0,
    seeds: int = SEEDS,
    chunks: Sequence[str] = CHUNKS,
    resume_from: Sequence = (),
    max_runs: int = 0,
    dry_run: bool = False,
    budget: Budget = LEASE,
    overrides: Sequence[tuple] = (),
    curve_points: int = 8,
    capture_fn: Optional[Callable] = None,
    say: Callable[[str], None] = print,
) -> dict:
    """Train the plan's runs not yet recorded in ``output`` or ``resume_from`` until ``budget_s``
    seconds of wall time would pass; returns {"trained", "left", "stopped" (why it stopped early,
    else None), "records"}. ``budget``, ``overrides`` and ``capture_fn``: the tests' tiny runs
    (``capture_fn`` as in :class:`~.resident.ResidentRun`)."""
    from .resident import ResidentData, graph_check

    t0, out = time.perf_counter(), pathlib.Path(output)
    plan, resume_from = lease_plan(seeds, chunks), [pathlib.Path(p) for p in resume_from]
    records = read_records([*resume_from, out])
    todo = [(c, s, sd) for c, s, sd in plan if run_id(s, sd) not in records]
    say(describe_plan(plan, records))
    if dry_run:
        return {"trained": 0, "left": len(todo), "stopped": "dry run", "records": records}
    data_path = find_fmnist(data_path)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: torch.cuda is not available here (the lease preset runs on a GPU)")
    out.mkdir(parents=True, exist_ok=True)
    _write_all(out, plan, records)
    _carry_log(out, resume_from)
    entry = {"started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "device": _device(dev)}
    entry.update(torch=torch.__version__, host=platform.node(), graph_check=None)
    done, stopped = [], None
    if todo:
        first = run_config(todo[0][1], 0, budget, data_path, overrides)
        data = ResidentData.load(first.data.path, first.data.subset, first.data.val_subset, dev)
        if dev.type == "cuda" or capture_fn is not None:  # graphs will run: first, do they train as the plain step?
            no_flip = run_config(todo[0][1], 0, budget, data_path, [*overrides, ("aug.hflip", 0.0)])
            entry["graph_check"] = graph_check(no_flip, data, dev, capture_fn)
            say(f"graph check: {entry['graph_check']}")
            stopped = None if entry["graph_check"]["ok"] else "graph check failed: the graphed step trains differently"
        if stopped is None:
            run = dict(budget=budget, data_path=data_path, overrides=overrides, curve_points=curve_points)
            run["errors"] = entry["errors"] = []
            done, stopped = _train(todo, plan, records, out, data, dev, t0, budget_s, max_runs, capture_fn, say, run)
    entry.update(wall_s=round(time.perf_counter() - t0, 1), runs_trained=len(done), stopped=stopped)
    entry.update(left=len(todo) - len(done), run_seconds=[round(t, 2) for _, t in done])
    entry["startup_s"] = round(entry["wall_s"] - sum(t for _, t in done), 1)  # data, graph check, first compiles
    _log_invocation(out, entry)
    say(f"lease: {entry['runs_trained']} runs trained in {entry['wall_s']:.0f} s, {entry['left']} left")
    return {"trained": len(done), "left": entry["left"], "stopped": stopped, "records": records}


def _device(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type


def _train(
    todo, plan, records, out, data, dev, t0, budget_s, max_runs, capture_fn, say, run
) -> tuple[list, Optional[str]]:
    """Train ``todo`` in order, each record written into its chunk file at once, until ``max_runs``
    or until the next run would pass ``budget_s`` -> ([(setting, seconds)], why it stopped or None)."""
    from .resident import ResidentRun, model_macs

    done, macs, failed = [], {}, 0
    for n, (chunk, setting, seed) in enumerate(todo):
        if max_runs and n >= max_runs:
            return done, "max runs"
        if time.perf_counter() - t0 + _expected_s(setting, done, dev) > budget_s:
            return done, "time budget"
        t_run = time.perf_counter()
        try:
            cfg = run_config(setting, seed, run["budget"], run["data_path"], run["overrides"])
            if setting.key not in macs:
                macs[setting.key] = model_macs(cfg)
            numbers = ResidentRun(cfg, data, dev, capture_fn).train(curve_points=run["curve_points"])
        except Exception as err:  # noqa: BLE001 - one run's failure (a kernel out of resources) must not end the lease
            text = str(err).strip().splitlines()
            run["errors"].append(
                {"run": run_id(setting, seed), "error": f"{type(err).__name__}: {text[0] if text else ''}"}
            )
            say(f"[{n + 1}/{len(todo)}] {setting.key} seed {seed}: failed, no record ({run['errors'][-1]['error']})")
            _free(dev)
            failed += 1
            if failed >= MAX_FAILURES_IN_A_ROW:
                return done, f"{failed} runs failed in a row (the device may be unusable: see errors)"
            continue
        failed = 0
        done.append((setting, time.perf_counter() - t_run))
        records[run_id(setting, seed)] = _record(setting, seed, cfg, numbers, macs[setting.key], run["budget"])
        _write_all(out, [p for p in plan if p[0] == chunk], records)
        _free(dev)
        say(_run_line(n, len(todo), setting, seed, numbers, done[-1][1]))
    return done, None


def _run_line(n: int, total: int, setting: Setting, seed: int, numbers: dict, seconds: float) -> str:
    top1 = "diverged" if numbers["top1"] is None else f"top-1 {numbers['top1']:.2f}"
    how = "graphed" if numbers["graphed"] else f"ungraphed: {numbers['why_not']}"
    return f"[{n + 1}/{total}] {setting.key} seed {seed}: {top1}, {seconds:.1f} s (step {numbers['step_ms']} ms, {how})"


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", required=True, help="folder for the chunk files and lease-log.json (on a lease: $OUT)")
    p.add_argument("--resume-from", nargs="*", default=[], help="folders of earlier leases' returned files")
    p.add_argument("--budget-s", type=float, default=450.0, help="wall seconds: no run starts that would pass it")
    p.add_argument("--device", default="cuda")
    p.add_argument("--data", help="the Fashion-MNIST folder (default: $INLINE_ATTN_FMNIST or the usual places)")
    p.add_argument("--seeds", type=int, default=SEEDS)
    p.add_argument("--max-runs", type=int, default=0, help="stop after this many runs (0: no limit)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the estimates; train nothing")
    p.add_argument("--doc", help="markdown file for the lease's section (docs/reproduction.md), and its PNG beside it")
    p.add_argument("--report-only", action="store_true", help="train nothing: write --doc from the records")
    p.add_argument("--replace-fewer", action="store_true", help="replace --doc's section even if it has more runs")
    args = p.parse_args(argv)
    try:
        if args.report_only:
            from .lease_report import write_lease_report

            if not args.doc:
                raise ValueError("--report-only writes --doc: name the markdown file")
            print(write_lease_report([*args.resume_from, args.output], args.doc, seeds=args.seeds,
                                     replace_fewer=args.replace_fewer))  # fmt: skip
            return 0
        res = run_lease(
            args.output,
            device=args.device,
            data_path=args.data,
            budget_s=args.budget_s,
            seeds=args.seeds,
            resume_from=args.resume_from,
            max_runs=args.max_runs,
            dry_run=args.dry_run,
        )
        if args.doc:
            from .lease_report import write_lease_report

            write_lease_report([*args.resume_from, args.output], args.doc, seeds=args.seeds,
                               replace_fewer=args.replace_fewer)  # fmt: skip
    except ValueError as err:
        print(f"lease: {err}", file=sys.stderr)
        return 2
    return 0 if res["left"] == 0 or args.dry_run else 3


if __name__ == "__main__":
    raise SystemExit(main())
