"""The designs of the InLine core's one-program-per-(sample, head) launch and their parameters: what
an entry of the tuning table (``triton_tuning.json``, the winners of gpu-check's autotune step) or a
forced choice (:func:`~inline_attn.ops.fused.triton.forced_core`) names.

An entry is a choice for both directions, ``{"design": "resident", "num_warps": 4}``,
``{"design": "stream", "BLOCK_N": 32, "num_warps": 8}`` or ``{"design": "fused", "BLOCK_N": 64,
"num_warps": 2}`` (no ``design``: fused), or one per direction, ``{"forward": {...}, "backward":
{...}}``; a resident choice may name how its forward adds the residual's taps, ``"serial_taps":
true`` (one at a time) or ``false`` (three in flight; without it, the launcher's rule). Keys ending
in ``ms`` are timings kept beside the choice (read by people, not here).
"""

from __future__ import annotations

from dataclasses import dataclass

# resident: Q, K, V (and G) held as whole [NP, BD] tiles; stream: the streaming programs
# (triton_stream.py); fused: the fused launch's reduction and token loops (triton_kernels.py)
DESIGNS = ("resident", "stream", "fused")
TILE_ROWS = (16, 32, 64, 128)
WARPS = (1, 2, 4, 8, 16)
DIRECTIONS = ("forward", "backward")
_CHOICE_KEYS = {"design", "BLOCK_N", "num_warps", "serial_taps"}


@dataclass(frozen=True)
class CoreChoice:
    """One direction's launch: ``design`` (one of DESIGNS), its warps per program and, for the
    stream and fused designs, its rows per tile (``block_n``; None for resident, whose tile is the
    whole problem); for the resident design, whether its forward adds the residual's taps one at a
    time (``serial_taps``; None: the launcher's rule, serial at the largest 16-bit tiles).

    Raises:
        ValueError: an unknown design, warps not in WARPS, a tile not in TILE_ROWS (or given
            to the resident design), or serial_taps not a bool (or given to another design).
    """

    design: str
    num_warps: int
    block_n: int | None = None
    serial_taps: bool | None = None

    def __post_init__(self):
        if self.design not in DESIGNS:
            raise ValueError(f"core design {self.design!r}: expected one of {DESIGNS}")
        if self.num_warps not in WARPS:
            raise ValueError(f"{self.design} design: num_warps {self.num_warps!r}, expected one of {WARPS}")
        if self.design == "resident" and self.block_n is not None:
            raise ValueError(f"resident design: BLOCK_N {self.block_n!r} given, but its tile is the whole problem")
        if self.design != "resident" and self.block_n not in TILE_ROWS:
            raise ValueError(f"{self.design} design: BLOCK_N {self.block_n!r}, expected one of {TILE_ROWS}")
        if self.serial_taps is not None and self.design != "resident":
            raise ValueError(
                f"{self.design} design: serial_taps {self.serial_taps!r} given, but only the resident design has it"
            )
        if self.serial_taps is not None and not isinstance(self.serial_taps, bool):
            raise ValueError(
                f"resident design: serial_taps {self.serial_taps!r}, expected True, False or None (the launcher's rule)"
            )

    def as_entry(self) -> dict:
        """The choice as the tuning table writes it."""
        entry = {"design": self.design, "num_warps": self.num_warps}
        if self.block_n is not None:
            entry["BLOCK_N"] = self.block_n
        if self.serial_taps is not None:
            entry["serial_taps"] = self.serial_taps
        return entry

    def __str__(self) -> str:
        rows = "" if self.block_n is None else f" {self.block_n} rows"
        taps = "" if self.serial_taps is None else (" serial taps" if self.serial_taps else " taps three at a time")
        return f"{self.design} {self.num_warps} warps{rows}{taps}"


def _choice(entry, where: str) -> CoreChoice:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: {entry!r} is not an object")
    unknown = sorted(k for k in entry if k not in _CHOICE_KEYS and not k.endswith("ms"))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown} in {entry}; a choice has {sorted(_CHOICE_KEYS)}")
    if "num_warps" not in entry:
        raise ValueError(f"{where}: {entry} needs num_warps")
    try:
        design, taps = entry.get("design", "fused"), entry.get("serial_taps")
        return CoreChoice(design, entry["num_warps"], entry.get("BLOCK_N"), taps)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def entry_choices(entry, where: str = "tuning entry") -> tuple[CoreChoice, CoreChoice]:
    """(forward, backward) choices of a tuning-table entry (the module's doc gives its forms).

    Raises:
        ValueError: the entry is malformed; names ``where`` (the table and key), the entry and what
            was expected.
    """
    if isinstance(entry, dict) and any(k in entry for k in DIRECTIONS):
        stray = sorted(k for k in entry if k not in DIRECTIONS and not k.endswith("ms"))
        missing = [k for k in DIRECTIONS if k not in entry]
        if stray or missing:
            raise ValueError(f"{where}: a per-direction entry has 'forward' and 'backward' only (and timings): {entry}")
        return _choice(entry["forward"], f"{where} forward"), _choice(entry["backward"], f"{where} backward")
    both = _choice(entry, where)
    return both, both


def choices_entry(forward: CoreChoice, backward: CoreChoice, **timings: float) -> dict:
    """A tuning-table entry of these choices (one choice when both directions agree), with ``timings``
    (keys ending in ``ms``) beside them."""
    if any(not k.endswith("ms") for k in timings):
        raise ValueError(f"timings {sorted(timings)}: their keys end in 'ms'")
    if forward == backward:
        return {**forward.as_entry(), **timings}
    return {"forward": forward.as_entry(), "backward": backward.as_entry(), **timings}
