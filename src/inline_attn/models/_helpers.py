"""Small helpers shared by the model families: attention patterns and feature indices.

Pattern strings (the paper's notation, per stage): ``I`` = InLine, ``S`` = softmax as in the base
architecture, ``L`` = linear attention (ReLU feature map) laid out like InLine; the other linear attentions laid out
like InLine: ``H`` = Hydra, ``E`` = Efficient attention, ``A`` = linear-angular (Castling-ViT),
``V`` = ReLU multi-scale (EfficientViT), ``F`` = focused (FLatten), ``G`` = agent attention,
``P`` = polarity-aware (PolaFormer),
``R`` = RoPE linear attention of MLLA; ``M`` = mixed: with an
``M<n>`` suffix after the stage letters, the first n blocks of every M stage are InLine and the
rest softmax ("IIMS2", also written "IIMSM2").
"""

from __future__ import annotations

import operator
import re
from typing import Sequence, Union

PATTERN_KINDS = {
    "I": "inline",
    "S": "softmax",
    "L": "linear",
    "H": "hydra",
    "E": "efficient",
    "A": "angular",
    "V": "relu_msa",
    "F": "focused",
    "G": "agent",
    "P": "polarity",
    "R": "mlla",
}
# stage letters, then the optional mixed-stage block count: "IIMS2" or "IIMSM2" (the letter class is
# built from PATTERN_KINDS, so a new kind is one entry there)
_PATTERN_RE = re.compile(rf"([{''.join(PATTERN_KINDS)}M]+?)(?:M?(\d+))?")


def pattern_stage_count(pattern: str) -> int:
    """How many stages ``pattern`` names ("IIMS2" -> 4, "I" -> 1); ValueError for a malformed one."""
    m = _PATTERN_RE.fullmatch(pattern)
    if m is None:
        raise ValueError(f"pattern {pattern!r}: expected stage letters from {'/'.join(PATTERN_KINDS)}/M")
    return len(m.group(1))


def parse_pattern(pattern: str, depths: Sequence[int]) -> list[list[str]]:
    """``pattern`` ("IIIS", "IIMS2", "I") -> per stage, per block attention kind.

    Raises ValueError naming the pattern when its letters do not match the number of stages, an M
    stage has no block count, or the count is 0 or more than an M stage's blocks.
    """
    if not isinstance(pattern, str):
        raise ValueError(f"pattern must be a string such as 'IIIS', got {pattern!r}")
    m = _PATTERN_RE.fullmatch(pattern)
    letters, mixed = (m.group(1), m.group(2)) if m else (None, None)
    if letters is None or len(letters) != len(depths):
        raise ValueError(
            f"pattern {pattern!r} must give one of {'/'.join(PATTERN_KINDS)}/M per stage ({len(depths)} stages), "
            f"optionally followed by M<n>, e.g. {'I' * len(depths)!r}"
        )
    if "M" in letters and mixed is None:
        raise ValueError(f"pattern {pattern!r} marks a stage M but gives no M<n> block count")
    if "M" not in letters and mixed is not None:
        raise ValueError(f"pattern {pattern!r} gives a block count but marks no stage M")
    mixed_depths = [d for letter, d in zip(letters, depths) if letter == "M"]
    if mixed is not None and not 1 <= int(mixed) <= min(mixed_depths):
        raise ValueError(
            f"pattern {pattern!r}: the InLine block count of a mixed stage must be in [1, {min(mixed_depths)}] "
            f"(the M stages have {mixed_depths} blocks), got {int(mixed)}"
        )
    kinds = []
    for letter, depth in zip(letters, depths):
        if letter == "M":
            n = int(mixed)
            kinds.append(["inline" if j < n else "softmax" for j in range(depth)])
        else:
            kinds.append([PATTERN_KINDS[letter]] * depth)
    return kinds


def take_indices(num_features: int, indices: Union[None, int, Sequence[int]]) -> list[int]:
    """Resolve ``indices`` for ``forward_intermediates``: None = all, int n = the last n,
    a sequence = those (negative counts from the end). Returns sorted non-negative indices.

    Raises ValueError naming ``indices`` and the valid range when an index does not exist, and
    naming the level when two indices give the same one (``(1, 1)``, or ``(1, -3)`` of 4 levels):
    the maps returned would be fewer than the indices asked for.
    """
    if indices is None:
        return list(range(num_features))
    if isinstance(indices, int) and not isinstance(indices, bool):
        if not 0 < indices <= num_features:
            raise ValueError(f"indices={indices}: expected a count of last levels in [1, {num_features}]")
        return list(range(num_features - indices, num_features))
    if not isinstance(indices, Sequence) or isinstance(indices, str) or not indices:
        raise ValueError(f"indices={indices!r}: expected None, a count, or a non-empty sequence of level indices")
    out = []
    for i in indices:
        j = _as_int(i)
        if j is None or not -num_features <= j < num_features:
            raise ValueError(
                f"indices={indices!r}: level {i!r} does not exist; the model has {num_features} "
                f"level(s), indices {-num_features}..{num_features - 1}"
            )
        if j % num_features in out:
            raise ValueError(f"indices={indices!r}: level {j % num_features} is given twice; give each level once")
        out.append(j % num_features)
    return sorted(out)


def _as_int(value) -> Union[int, None]:
    """An integer index (Python or numpy int), or None for anything else (bools included)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None
