"""``make gpu-check``'s runner: the steps in order, each in its time box, the results saved as
they come.

The check's steps run in the order of :data:`STEPS` (the default ones: tests, goals, profile, compile, ncu), each
once, whatever order ``--steps`` names them in. A step's box is its budget or what is left of the
whole check's (``--budget-s``, default :data:`TOTAL_S`), whichever is less; a step whose box would
be under its least useful time is not started, with a line saying so. The results are written
after every part of every step (:func:`.output.save`), so a run stopped by a time limit keeps
what it measured. On a machine without CUDA it exits at once (status 2) with a message, except
with ``--dry-run``, which prints the plan (:func:`dry_run`) and writes the summary of a run that
measured nothing, on any machine: the lease's script checked before the lease.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import torch

from . import (
    autotune_step,
    cache_step,
    compile_step,
    device,
    goals_step,
    ncu_step,
    output,
    profile_step,
    tests_step,
    train_step,
)
from .budget import StepContext

TOTAL_S = 465.0  # the steps' boxes: with the copy rate, under the lease script's 8 minutes
LEASE_SCRIPT_S = 480.0  # the most a lease's script may take: the steps and the copy-rate measurement before them
COPY_RATE_S = 10.0  # about what measuring the copy rate and the device record take before the steps


@dataclass(frozen=True)
class Step:
    """A step: ``run(ctx)`` -> its result (``ok``: True / False / None for skipped, ``summary``);
    ``budget_s``: the most seconds it is given; ``min_s``: below this it is not started;
    ``parts``: its ``--parts`` names; ``default``: in a plain ``make gpu-check``."""

    run: Callable[[StepContext], dict]
    budget_s: float
    min_s: float
    parts: tuple[str, ...] = ()
    default: bool = True


def _names(parts) -> tuple[str, ...]:
    return tuple(p.name for p in parts)


# in the order they run: the default ones by value (their budgets add up to TOTAL_S), then those on
# demand. Boxes from H200s, a fresh machine each time: on 2026-11-26 (no prebuilt Triton cache) the
# tests took over 160 s cold (14 workers; most of it compiling), the goals 55-65 s, the profile 28 s,
# the compile step 53-77 s; on 2026-11-28 (the cache prebuilt) the tests 120 s, the goals 35 s, the
# profile 27 s (eager only), the compile step 64 s. The profile's box grew by 5 s for each model's
# CUDA-graphed step (profile_step.PARTS). Each box holds its parts' usual seconds.
STEPS = {
    "tests": Step(tests_step.run, 175, 40),
    "goals": Step(goals_step.run, 90, 30, _names(goals_step.PARTS)),
    "profile": Step(profile_step.run, 50, 15, _names(profile_step.PARTS)),
    "compile": Step(compile_step.run, 90, 75, _names(compile_step.PARTS)),
    "ncu": Step(ncu_step.run, 60, 30),  # an estimate: ncu's replays of six kernels and a child process
    "train": Step(train_step.run, 45, 30, default=False),
    "autotune": Step(autotune_step.run, 120, 60, default=False),
}


def plan(step: Step, seconds_left: float) -> tuple[bool, float]:
    """Whether ``step`` starts with ``seconds_left`` of the whole budget, and its box in seconds."""
    box = min(step.budget_s, seconds_left)
    return box >= step.min_s, box


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu-check", description="The GPU checks of one lease (make gpu-check).")
    parser.add_argument("--out", default="gpu_check_results", help="results folder (default gpu_check_results)")
    defaults = [name for name, s in STEPS.items() if s.default]
    parser.add_argument("--steps", nargs="+", default=defaults, choices=list(STEPS), help=f"default: {defaults}")
    every_part = sorted({p for s in STEPS.values() for p in s.parts})
    parser.add_argument("--parts", nargs="+", choices=every_part, help="only these parts of the steps run")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run of the check)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=TOTAL_S,
        help=f"seconds for all steps (default {TOTAL_S:.0f}); a step that no longer fits is not started",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (steps, boxes, parts, test files) and write the summary of an empty run; no GPU needed",
    )
    return parser.parse_args(argv)


def dry_run(args: argparse.Namespace) -> tuple[str, list[str]]:
    """The plan of a run with ``args``: each step in order with its box, its parts (and their usual
    seconds) or test files, and the total -> (the plan's text, the problems: a total over
    LEASE_SCRIPT_S, a step's parts' usual seconds over its box, a part asked for that no step runs)."""
    lines, problems, left = [], [], args.budget_s
    for name in sorted(set(args.steps), key=list(STEPS).index):
        step = STEPS[name]
        start, box = plan(step, left)
        lines.append(f"{name}: box {box:.0f} s" + ("" if start else f" - not started (needs {step.min_s:.0f} s)"))
        if start:
            left -= box
        parts = _STEP_PARTS.get(name, ())
        chosen = [p for p in parts if args.parts is None or p.name in args.parts]
        lines += [f"  {p.name}: about {p.usual_s:.0f} s" for p in chosen]
        if sum(p.usual_s for p in chosen) > box and start:
            problems.append(f"{name}: its parts take about {sum(p.usual_s for p in chosen):.0f} s, over its box")
        if name == "tests":
            lines += [f"  {f}" for f in tests_step.TEST_FILES]
    total = args.budget_s - left + COPY_RATE_S
    lines.append(f"total: at most {total:.0f} s (steps {args.budget_s - left:.0f} s + copy rate {COPY_RATE_S:.0f} s)")
    lines.append(cache_step.dry_run_line(autotune="autotune" in args.steps))
    if total > LEASE_SCRIPT_S:
        problems.append(f"the plan takes up to {total:.0f} s, over the lease script's {LEASE_SCRIPT_S:.0f} s")
    every = {p.name for parts in _STEP_PARTS.values() for p in parts}
    problems += [f"part {p} is in no step" for p in args.parts or () if p not in every]
    return "\n".join(lines), problems


_STEP_PARTS = {"goals": goals_step.PARTS, "profile": profile_step.PARTS, "compile": compile_step.PARTS}


def run_step(name: str, args, ctx_kw: dict, deadline: float, record: Callable[[dict], None]) -> dict:
    """Run the step ``name`` in its box (or record why not); ``record(result)`` saves its result so far."""
    step, t0 = STEPS[name], time.time()
    start, box = plan(step, deadline - t0)
    if not start:
        left = max(deadline - t0, 0)
        why = f"not started: {left:.0f} s of the {args.budget_s:.0f} s budget left, it needs {step.min_s:.0f} s"
        print(f"   {name}: {why}", flush=True)
        return {"ok": None, "seconds": 0.0, "summary": why}
    print(f"== {name} (box {box:.0f} s)", flush=True)

    def save_partial(partial: dict) -> None:
        record({**partial, "partial": True, "seconds": time.time() - t0})

    ctx = StepContext(deadline=t0 + box, save=save_partial, parts=args.parts, **ctx_kw)
    try:
        result = dict(step.run(ctx))
    except Exception as err:  # noqa: BLE001 - record it and go on with the other steps
        result = {"ok": False, "summary": f"{type(err).__name__}: {err} (errors.txt)"[:400]}
        ctx.error(name, traceback.format_exc())
    result["seconds"] = time.time() - t0
    print(f"   {name}: {result.get('summary', 'done')} ({result['seconds']:.0f} s)", flush=True)
    return result


def _report_dry_run(args: argparse.Namespace, argv: list[str]) -> int:
    text, problems = dry_run(args)
    print(text)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    output.save(out, {"device": "dry run (no device)"}, {}, argv)  # the goal table with nothing measured
    for p in problems:
        print(f"gpu-check --dry-run: {p}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.dry_run:
        return _report_dry_run(args, argv)
    if not torch.cuda.is_available():
        print(
            "gpu-check: no CUDA device here. It runs on a machine with an NVIDIA GPU, a CUDA build of PyTorch "
            "and triton (python3 there, with the project on PYTHONPATH=src).",
            file=sys.stderr,
        )
        return 2
    os.environ.pop("TRITON_INTERPRET", None)
    deadline = time.time() + args.budget_s
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**device.versions(), **cache_step.install()}  # the cache before anything compiles
    env["copy_GBps"] = round(device.copy_bandwidth() / 1e9)
    print(f"gpu-check on {env['device']} (driver {env['driver']}, torch {env['torch']}, triton {env['triton']})")
    results: dict = {}
    output.save(out, env, results, argv)

    def error(where: str, text: str) -> None:
        output.append_error(out, where, text)

    ctx_kw = dict(out=out, quick=args.quick, error=error, env=env)
    for name in sorted(set(args.steps), key=list(STEPS).index):  # each step once, in the check's order

        def record(result: dict, name: str = name) -> None:
            results[name] = result
            output.save(out, env, results, argv)

        record(run_step(name, args, ctx_kw, deadline, record))
    env["triton_cache"] = cache_step.compiled_here(env)
    problems = output.limit_problems(out)
    for p in problems:
        print(f"gpu-check: {p}", file=sys.stderr)
    print(output.save(out, env, results, argv))
    failed = [name for name, r in results.items() if r.get("ok") is False]
    return 1 if failed or problems else 0
