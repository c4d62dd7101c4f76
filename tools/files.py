"""The tools' file writes: whole files or none (a tool stopped by a lease's time limit leaves no half file)."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Union

PathLike = Union[str, os.PathLike]


def atomic_write_text(path: PathLike, text: str) -> pathlib.Path:
    """``text`` into ``path`` (its folder created) through a temporary file beside it, renamed over ``path``."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def read_json(path: PathLike):
    """The JSON document in ``path``."""
    return json.loads(pathlib.Path(path).read_text())


def save_figure(fig, path: PathLike, **savefig_kwargs) -> pathlib.Path:
    """``fig.savefig`` through a temporary file (the format from ``path``'s suffix: ``.png``, ``.pdf``)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fig.savefig(tmp, format=path.suffix.lstrip(".").lower() or None, **savefig_kwargs)
    os.replace(tmp, path)
    return path
