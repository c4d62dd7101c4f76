"""``data.val_subset``: the first N images of a validation set, checked against the set's size."""

from __future__ import annotations

__all__ = ["val_subset_size"]


def val_subset_size(val_subset: int, size: int, what: str) -> int:
    """How many validation images ``data.val_subset`` takes from a set of ``size`` (``what``
    names the set: its file, folder or setting): ``size`` for 0, else ``val_subset``.

    A ``val_subset`` larger than the set is a ValueError naming both numbers: "the first N" of a
    smaller set would score fewer images than asked for (or, for the mosaics, draw new ones)."""
    n = int(val_subset)
    if n > size:
        raise ValueError(
            f"data.val_subset={n} asks for the first {n} validation images, but {what} holds {size}; "
            f"give at most {size} (0: all)"
        )
    return n or size
