"""The time box of a step and the parts it runs in it.

A step gets a :class:`StepContext` whose ``deadline`` ends its box. A step made of parts (the goal
measurements, one profile per model) runs them in order of value through :func:`run_parts`: a
part starts only while its usual seconds still fit, and the step's result so far is saved after
every part, so a run stopped by a time limit keeps the parts it finished.
"""

from __future__ import annotations

import pathlib
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence


@dataclass
class StepContext:
    """What a step is given.

    Attributes:
        out: the results folder (only the files of :mod:`.output` go there).
        quick: fewer repeats (a smoke run of the check).
        deadline: ``time.time()`` at which the step's box ends.
        save: records the step's result so far (a dict) and rewrites the result files.
        error: ``error(where, text)`` keeps a traceback in ``errors.txt``.
        env: the device record (:func:`.device.versions`, with ``copy_GBps``).
        parts: the parts asked for (``--parts``); None: all.
    """

    out: pathlib.Path
    quick: bool
    deadline: float
    save: Callable[[dict], None] = lambda result: None
    error: Callable[[str, str], None] = lambda where, text: None
    env: dict = field(default_factory=dict)
    parts: Optional[Sequence[str]] = None

    def seconds_left(self) -> float:
        return self.deadline - time.time()


@dataclass(frozen=True)
class Part:
    """One measurement of a step: ``run(ctx)`` returns ``{"values": {goal key: number}, "notes":
    {goal key: text}, ...}`` (any other keys are kept in the results JSON); ``usual_s``: about how
    long it takes on an H100 once the kernels are compiled, the least it is started with."""

    name: str
    usual_s: float
    run: Callable[[StepContext], dict]


def run_parts(ctx: StepContext, parts: Sequence[Part]) -> dict:
    """Run ``parts`` in order within ``ctx``'s box -> ``{"ok", "summary", "values", "notes",
    "parts", "skipped"}``; a part that raises is recorded (``errors.txt``) and the next one runs."""
    result = {"ok": True, "summary": "", "values": {}, "notes": {}, "parts": {}, "skipped": {}}
    for part in parts:
        left = ctx.seconds_left()
        if ctx.parts is not None and part.name not in ctx.parts:
            result["skipped"][part.name] = "not asked for (--parts)"
            continue
        if left < part.usual_s:
            result["skipped"][part.name] = (
                f"not started: {max(left, 0):.0f} s left in the box, it takes about {part.usual_s:.0f} s"
            )
            print(f"   {part.name}: {result['skipped'][part.name]}", flush=True)
            continue
        t0 = time.time()
        try:
            record = dict(part.run(ctx))
        except Exception as err:  # noqa: BLE001 - record it and go on with the next part
            record = {"error": f"{type(err).__name__}: {err}"[:300]}
            ctx.error(part.name, traceback.format_exc())
            result["ok"] = False
        record["seconds"] = round(time.time() - t0, 1)
        result["values"].update(record.pop("values", {}))
        result["notes"].update(record.pop("notes", {}))
        result["parts"][part.name] = record
        result["summary"] = parts_summary(result)
        print(f"   {part.name}: {record.get('error', 'done')} ({record['seconds']:.0f} s)", flush=True)
        ctx.save(result)
    result["summary"] = parts_summary(result)
    return result


def parts_summary(result: dict) -> str:
    """One line: each part run with its seconds (or its error), then those not started."""
    ran = [
        f"{name} {'FAILED' if 'error' in r else 'ran'} ({r['seconds']:.0f} s)" for name, r in result["parts"].items()
    ]
    skipped = [name for name, why in result["skipped"].items() if why.startswith("not started")]
    line = ", ".join(ran) or "no part ran"
    return line + (f"; not started for lack of time: {', '.join(skipped)}" if skipped else "")
