"""The designs of the InLine core's one-program-per-(sample, head) launch and their parameters: what
an entry of the tuning table (``triton_tuning.json``, the winners of gpu-check's autotune step) or a
forced choice (:func:`~inline_attn.ops.fused.triton.forced_core`) names.

An entry is a choice for both directions, ``{"design": "resident", "num_warps": 4}``,
``{"design": "stream", "BLOCK_N": 32, "num_warps": 8}`` or ``{"design": "fused", "BLOCK_N": 64,
"num_warps": 2}`` (no ``design``: fused), or one per direction, ``{"forward": {...}, "backward":
{...}}``. Keys ending in ``ms`` are timings kept beside the choice (read by people, not here).
"""

from __future__ import annotations

from dataclasses import dataclass

# resident: Q, K, V (and G) held as whole [NP, BD] tiles; stream: the streaming programs
# (triton_stream.py); fused: the fused launch's reduction and token loops (triton_kernels.py)
DESIGNS = ("resident", "stream", "fused")
TILE_ROWS = (16, 32, 64, 128)
WARPS = (1, 2, 4, 8, 16)
DIRECTIONS = ("forward", "backward")
_CHOICE_KEYS = {"design", "BLOCK_N", "num_warps"}


@dataclass(frozen=True)
class CoreChoice:
    """One direction's launch: ``design`` (one of DESIGNS), its warps per program and, for the
    stream and fused designs, its rows per tile (``block_n``; None for resident, whose tile is the
    whole problem).

    Raises:
        ValueError: an unknown design, warps not in WARPS, or a tile not in TILE_ROWS (or given
            to the resident design).
    """

    design: str
    num_warps: int
    block_n: int | None = None

    def __post_init__(self):
        if self.design not in DESIGNS:
            raise ValueError(f"core design {self.design!r}: expected one of {DESIGNS}")
        if self.num_warps not in WARPS:
            raise ValueError(f"{self.design} design: num_warps {self.num_warps!r}, expected one of {WARPS}")
        if self.design == "resident" and self.block_n is not None:
            raise ValueError(f"resident design: BLOCK_N {self.block_n!r} given, but its tile is the whole problem")
        if self.design != "resident" and self.block_n not in TILE_ROWS:
            raise ValueError(f"{self.design} design: BLOCK_N {self.block_n!r}, expected one of {TILE_ROWS}")

    def as_entry(self) -> dict:
        """The choice as the tuning table writes it."""
        entry = {"design": self.design, "num_warps": self.num_warps}
        return entry if self.block_n is None else {**entry, "BLOCK_N": self.block_n}

    def __str__(self) -> str:
        return f"{self.design} {self.num_warps} warps" + ("" if self.block_n is None else f" {self.block_n} rows")


def _choice(entry, where: str) -> CoreChoice:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: {entry!r} is not an object")
    unknown = sorted(k for k in entry if k not in _CHOICE_KEYS and not k.endswith("ms"))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown} in {entry}; a choice has {sorted(_CHOICE_KEYS)}")
    if "num_warps" not in entry:
        raise ValueError(f"{where}: {entry} needs num_warps")
    try:
        return CoreChoice(entry.get("design", "fused"), entry["num_warps"], entry.get("BLOCK_N"))
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
