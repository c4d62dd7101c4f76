"""Barrier phases of a compiled Triton kernel, and what they predict of its GPU time.

At the InLine layer's shapes every program of a core kernel fits in a few waves over the
multiprocessors, and each program is a serial chain of CTA barrier phases: a layout conversion
through shared memory, a cross-warp reduction or a product's operands staged for ``tl.dot``, each
followed by loads issued only after the barrier. A kernel's time then goes as

    time ~ (barriers one program executes) x ceil(waves) x (a cost per phase-wave)

with waves = programs / (resident programs per multiprocessor x multiprocessors); an H200
measured 0.12-0.24 us per phase-wave across both core designs and three layer shapes
(docs/benchmarks.md, "What predicts the kernels' GPU time without a GPU?").

The barrier structure is read from the kernel's SASS (``nvdisasm`` on the cubin ``ptxas`` made)
and is independent of the layer's shape: the barriers on the straight-line path, and per loop its
own body's barriers, its nested loops and its trip rule, taken from the matching ``scf.for`` of
the kernel's TTGIR (a constant, or ceil((hi - lo) / step) with ``hi`` / ``lo`` a kernel argument,
read from each launch's arguments). A SASS loop is a backward branch to an earlier label; a
constant-trip ``scf.for`` that LLVM unrolled has no SASS loop, its barriers counted where they sit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

# an instruction of nvdisasm's listing (``/*0450*/  LDGDEPBAR ;``), a label (``.L_x_3:``), a branch
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA(?:\.\w+)*\s+(?:[^`;]*,\s*)?`\((\.L_x_\d+)\)")
# a barrier every thread of the program waits at (BAR.ARV only arrives: no wait)
_BARRIER = re.compile(r"\bBAR\.(?:SYNC|RED)\b")

_FOR = re.compile(r"^(\s*)(?:%\S+\s*=\s*)?scf\.for %\S+ = %(\S+) to %(\S+) step %(\S+)")
_CONSTANT = re.compile(r"%(\S+) = arith\.constant (-?\d+) : i(?:32|64)\b")
_FUNCTION = re.compile(r"tt\.func public @\w+\((.*)\)\s*(?:attributes|\{)")
_PARAMETER = re.compile(r"%([\w$.-]+)\s*:")

# the cost of one phase-wave an H200 measured (us): the least and the most of the calibration in
# docs/benchmarks.md (both core designs, fwd+bwd at three layer shapes, timed interleaved in one run)
PHASE_WAVE_US = (0.12, 0.24)


def _trips(lo: int, hi: int, step: int) -> int:
    """Iterations of ``range(lo, hi, step)`` (step > 0)."""
    return max(0, -(-(hi - lo) // step))


def _own_barriers(instructions: list[str], start: int, end: int, loops: list) -> int:
    """Barriers among instructions ``start`` to ``end`` outside the nested ``loops``."""
    inner = {i for loop in loops for i in range(loop.start, loop.end + 1)}
    return sum(1 for i in range(start, end + 1) if i not in inner and _BARRIER.search(instructions[i]))


class PhaseError(ValueError):
    """The SASS loops do not match the TTGIR's ``scf.for`` loops, or a trip count has no rule."""


@dataclass
class _Loop:
    """A loop of the listing: instructions ``start`` to ``end`` (inclusive), its nested loops."""

    start: int
    end: int
    loops: list = field(default_factory=list)


def sass_instructions(listing: str) -> tuple[list[str], dict[str, int]]:
    """The instructions of an nvdisasm listing, in order, and each label's instruction index."""
    instructions: list[str] = []
    labels: dict[str, int] = {}
    for line in listing.splitlines():
        label = _LABEL.match(line)
        if label:
            labels[label.group(1)] = len(instructions)
            continue
        instruction = _INSTRUCTION.match(line)
        if instruction:
            instructions.append(instruction.group(2))
    return instructions, labels


def sass_loops(instructions: list[str], labels: dict[str, int]) -> list[_Loop]:
    """The top-level loops (nested ones inside them): each label that a later branch jumps back to,
    up to its last such branch. A branch to itself (the trap at a kernel's end) is no loop.

    Raises:
        PhaseError: two loops overlap without one holding the other.
    """
    ends: dict[int, int] = {}
    for i, text in enumerate(instructions):
        branch = _BRANCH.search(text)
        start = labels.get(branch.group(1), i) if branch else i
        if start < i:
            ends[start] = max(ends.get(start, i), i)
    top: list[_Loop] = []
    open_loops: list[_Loop] = []
    for start, end in sorted(ends.items()):
        while open_loops and open_loops[-1].end < start:
            open_loops.pop()
        loop = _Loop(start, end)
        if open_loops and end > open_loops[-1].end:
            raise PhaseError(
                f"SASS loops at instructions {open_loops[-1].start}-{open_loops[-1].end} and {start}-{end} overlap"
            )
        (open_loops[-1].loops if open_loops else top).append(loop)
        open_loops.append(loop)
    return top


@dataclass
class _For:
    """An ``scf.for`` of the TTGIR: its bounds (an int, or a kernel parameter's name), step, nested loops."""

    lo: int | str
    hi: int | str
    step: int | str
    loops: list = field(default_factory=list)

    @property
    def constant_trip(self) -> int | None:
        if all(isinstance(v, int) for v in (self.lo, self.hi, self.step)):
            return _trips(self.lo, self.hi, self.step)
        return None


def ttgir_loops(ttgir: str) -> tuple[list[_For], list[str]]:
    """The top-level ``scf.for`` loops of a TTGIR module (nested ones inside them), and the kernel's
    parameters in order. A bound is an int where it is an ``arith.constant``, else the SSA name."""
    constants = {name: int(value) for name, value in _CONSTANT.findall(ttgir)}
    header = _FUNCTION.search(ttgir)
    parameters = _PARAMETER.findall(header.group(1)) if header else []
    top: list[_For] = []
    open_loops: list[tuple[int, _For]] = []
    for line in ttgir.splitlines():
        indent = len(line) - len(line.lstrip())
        if line.strip():
            while open_loops and indent <= open_loops[-1][0]:
                open_loops.pop()
        match = _FOR.match(line)
        if match:
            lo, hi, step = (constants.get(v, v) for v in match.group(2, 3, 4))
            loop = _For(lo, hi, step)
            (open_loops[-1][1].loops if open_loops else top).append(loop)
            open_loops.append((indent, loop))
    return top, parameters


def _barrier_free(loop: _Loop, instructions: list[str]) -> bool:
    """Whether ``loop`` (its nested loops included) holds no barrier."""
    return not any(_BARRIER.search(instructions[i]) for i in range(loop.start, loop.end + 1))


def _pair(sass: list[_Loop], fors: list[_For], instructions: list[str]) -> list[tuple[_Loop, _For]]:
    """Pair the SASS loops of one level with its ``scf.for`` loops, in order. LLVM unrolls small
    constant-trip loops completely: while the TTGIR has more loops, drop its constant-trip ones,
    the fewest trips first (the likeliest unrolled). A level whose SASS loops hold no barrier adds
    none whatever their pairing (ptxas may split a loop in two, an unrolled body and the rest):
    no pairs."""
    if len(sass) != len(fors) and all(_barrier_free(loop, instructions) for loop in sass):
        return []
    fors = list(fors)
    constant = sorted((f for f in fors if f.constant_trip is not None), key=lambda f: f.constant_trip)
    while len(fors) > len(sass) and constant:
        fors.remove(constant.pop(0))
    if len(fors) != len(sass):
        raise PhaseError(f"{len(sass)} SASS loops against {len(fors)} scf.for loops with a trip rule")
    return list(zip(sass, fors))


def _bound(value: int | str, parameters: list[str], paths: list[tuple]) -> int | list:
    """A bound as the structure keeps it: an int, or the argument path of the kernel parameter."""
    if isinstance(value, int):
        return value
    if value not in parameters or len(parameters) != len(paths):
        raise PhaseError(f"loop bound %{value} is neither a constant nor a kernel parameter")
    return list(paths[parameters.index(value)])


def _structure(loop: _Loop, rule: _For, instructions, parameters, paths) -> dict:
    own = _own_barriers(instructions, loop.start, loop.end, loop.loops)
    if not isinstance(rule.step, int) or rule.step <= 0:
        raise PhaseError(f"loop step %{rule.step} is not a positive constant")
    return dict(
        barriers=own,
        lo=_bound(rule.lo, parameters, paths),
        hi=_bound(rule.hi, parameters, paths),
        step=rule.step,
        names=[v if isinstance(v, str) else None for v in (rule.lo, rule.hi)],
        loops=[
            _structure(s, f, instructions, parameters, paths) for s, f in _pair(loop.loops, rule.loops, instructions)
        ],
    )


def barrier_structure(listing: str, ttgir: str, paths: list[tuple] = ()) -> dict:
    """The barrier structure of one kernel from its SASS ``listing`` and its ``ttgir``: ``{"straight":
    barriers outside every loop, "loops": [{"barriers": the body's own, "lo", "hi": an int or the
    argument path of a kernel parameter, "step", "names", "loops": nested}]}``. ``paths``: per
    TTGIR kernel parameter, its path in the launch's arguments (``(i,)``, or ``(i, j)`` for element
    ``j`` of tuple argument ``i``); see :func:`parameter_paths`.

    Raises:
        PhaseError: the loops of the SASS and of the TTGIR do not match, or a bound has no rule.
    """
    instructions, labels = sass_instructions(listing)
    top = sass_loops(instructions, labels)
    fors, parameters = ttgir_loops(ttgir)
    straight = _own_barriers(instructions, 0, len(instructions) - 1, top)
    loops = [_structure(s, f, instructions, parameters, list(paths)) for s, f in _pair(top, fors, instructions)]
    return dict(straight=straight, loops=loops)


def parameter_paths(signature: dict) -> list[tuple]:
    """Per kernel parameter of the TTGIR, its path in the launch's positional arguments, from an
    ASTSource's ``signature`` (name -> type, a tuple's types for a tuple; ``"constexpr"`` for a
    specialised value, which the TTGIR has no parameter for)."""
    paths: list[tuple] = []

    def walk(kind, path):
        if isinstance(kind, tuple):
            for j, element in enumerate(kind):
                walk(element, (*path, j))
        elif kind != "constexpr":
            paths.append(path)

    for i, kind in enumerate(signature.values()):
        walk(kind, (i,))
    return paths


def _argument(bound: int | list, args: tuple) -> int:
    if isinstance(bound, int):
        return bound
    value = args
    for index in bound:
        value = value[index]
    return int(value)


def trip_count(loop: dict, args: tuple) -> int:
    """The iterations of ``loop`` (a structure's loop) in a launch with arguments ``args``."""
    return _trips(_argument(loop["lo"], args), _argument(loop["hi"], args), loop["step"])


def _loop_barriers(loop: dict, args: tuple) -> int:
    return trip_count(loop, args) * (loop["barriers"] + sum(_loop_barriers(inner, args) for inner in loop["loops"]))


def barriers_per_program(structure: dict, args: tuple = ()) -> int:
    """The barriers one program executes in a launch with arguments ``args`` (:class:`Launch.args`)."""
    return structure["straight"] + sum(_loop_barriers(loop, args) for loop in structure["loops"])


def describe(structure: dict) -> str:
    """The structure as a formula, e.g. ``5 + ceil(geo / 32) x (2 + 3 x 1)``."""

    def loop_text(loop):
        if isinstance(loop["hi"], int) and isinstance(loop["lo"], int):
            trip = str(_trips(loop["lo"], loop["hi"], loop["step"]))
        else:
            lo, hi = (n or str(v) for n, v in zip(loop["names"], (loop["lo"], loop["hi"])))
            trip = f"ceil({hi} / {loop['step']})" if lo == "0" else f"ceil(({hi} - {lo}) / {loop['step']})"
        body = " + ".join([str(loop["barriers"])] + [loop_text(inner) for inner in loop["loops"]])
        return f"{trip} x ({body})" if loop["loops"] else f"{trip} x {body}"

    return " + ".join([str(structure["straight"])] + [loop_text(loop) for loop in structure["loops"]])


def waves(programs: int, per_multiprocessor: int, multiprocessors: int) -> float:
    """Waves of a grid of ``programs`` when ``per_multiprocessor`` of them are resident on each of
    ``multiprocessors`` (inf when none fits)."""
    return programs / (per_multiprocessor * multiprocessors) if per_multiprocessor else math.inf


def phase_waves(barriers: int, wave_count: float) -> int | None:
    """Barriers per program x ceil(waves): the serial barrier phases the whole grid runs."""
    return barriers * math.ceil(wave_count) if math.isfinite(wave_count) else None
