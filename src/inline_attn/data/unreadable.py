"""Unreadable files: logged once, counted, and skipped or stood in for, the same way in every
dataset that reads files (the classification folders, ADE20K, COCO).

A corrupt, truncated, zero-byte or inconsistent file never stops a training epoch: the next
readable sample stands in for it (:meth:`UnreadableFiles.substitute`). Evaluation must not score
a substitute: the classification reader returns ``None`` for the caller to skip and count, the
dense readers raise the ValueError naming the file (their metrics have no "skipped" count).
"""

from __future__ import annotations

import logging
import os
from typing import Callable, TypeVar, Union

from PIL import Image

__all__ = ["UnreadableFiles", "decode_image"]

log = logging.getLogger(__name__)
T = TypeVar("T")


def decode_image(path: Union[str, os.PathLike], what: str = "image") -> Image.Image:
    """The fully decoded image file at ``path`` (a truncated file fails here, not later), or a
    ValueError naming ``what``, the file and Pillow's reason (zero-byte, garbage, truncated)."""
    try:
        with Image.open(path) as im:
            im.load()
            return im
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, zlib errors ... for bad bytes
        raise ValueError(f"cannot decode {what} {path} ({type(e).__name__}: {e})") from e


class UnreadableFiles:
    """The unreadable samples of one dataset of ``n`` samples; ``name(i)`` says which file(s)
    sample i is, for the log (a method of the dataset, not a lambda: the dataset must stay
    picklable for loader workers started by spawn). ``bad`` holds the indices found unreadable so
    far (per process: each loader worker keeps its own)."""

    def __init__(self, n: int, name: Callable[[int], str], where: str):
        self.n, self.name, self.where = n, name, where
        self.bad: set[int] = set()

    def note(self, i: int, e: Exception) -> None:
        """Count sample ``i`` as unreadable, logging it the first time."""
        if i not in self.bad:
            self.bad.add(i)
            log.warning("unreadable %s (%s: %s)", self.name(i), type(e).__name__, e)

    def substitute(self, i: int, load: Callable[[int], T]) -> T:
        """``load(i)``, or ``load(j)`` of the next readable sample after i (wrapping around) when
        it raises; ValueError when no sample is readable."""
        for k in range(self.n):
            j = (i + k) % self.n
            if j in self.bad:
                continue
            try:
                return load(j)
            except Exception as e:  # corrupt/truncated/unreadable: stand in, never stop the epoch
                self.note(j, e)
        raise ValueError(f"no readable sample in {self.where} ({len(self.bad)} unreadable)")
