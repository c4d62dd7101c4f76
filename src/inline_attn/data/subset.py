"""``data.subset`` / ``data.val_subset``: the first N images of a data set, checked against its size
(classification and dense prediction alike)."""

from __future__ import annotations

__all__ = ["subset_size"]


def subset_size(n: int, size: int, what: str, *, setting: str = "data.val_subset", split: str = "validation") -> int:
    """How many images ``setting`` (``data.subset`` or ``data.val_subset``, ``n``; 0: all) takes
    from the ``split`` set of ``size`` images (``what`` names it: its file, folder or setting):
    ``size`` for 0, else ``n``.

    An ``n`` larger than the set is a ValueError naming both numbers: "the first N" of a smaller
    set would train on or score fewer images than asked for (or, for the mosaics, draw new ones)."""
    n = int(n)
    if n > size:
        raise ValueError(
            f"{setting}={n} asks for the first {n} {split} images, but {what} holds {size}; "
            f"give at most {size} (0: all)"
        )
    return n or size
