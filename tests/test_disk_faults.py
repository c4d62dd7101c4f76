"""A write onto a full or read-only disk: one clear error naming the path and the cause, the previous
file intact, no temporary file left, for every kind of file a run writes (checkpoint, safetensors
weights, config, report, figure).

The faults are real: a 256 KiB tmpfs mounted for the test (filled for "full", remounted read-only for
"read-only"). Where no tmpfs can be mounted (mounting needs root), the read-only case uses a folder
without write permission instead, and the full-disk case is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import subprocess

import pytest
import torch

from inline_attn._io import WriteFailed, atomic_write_text, save_figure
from inline_attn.models.checkpoint import save_checkpoint
from inline_attn.runtime.checkpoint import atomic_save, save_rotating
from inline_attn.runtime.report import write_json
from inline_attn.train.config import Config


def _mount(folder: pathlib.Path, options: str) -> bool:
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    except OSError:
        return False
    return done.returncode == 0


@pytest.fixture
def disk(tmp_path):
    """``(folder, fault)``: ``fault("full" | "read-only")`` turns the fault on in ``folder``."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = _mount(folder, "size=256k")

    def fault(kind: str) -> None:
        if kind == "full":
            if not mounted:
                pytest.skip("no small tmpfs to fill: mounting one needs root (CAP_SYS_ADMIN)")
            with contextlib.suppress(OSError), open(folder / "filler", "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        elif mounted:
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        else:
            os.chmod(folder, 0o555)
            if os.access(folder, os.W_OK):  # root without a mount: permissions do not bind it
                pytest.skip("no read-only folder: permissions do not bind this user and no tmpfs could be mounted")

    yield folder, fault
    if mounted:
        subprocess.run(["umount", "--lazy", str(folder)], check=False)  # a writer's file may still be open
    else:
        os.chmod(folder, 0o755)


def _figure_writer(path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(4, 4))
    fig.gca().plot(range(100))
    try:
        save_figure(fig, path, dpi=80)
    finally:
        plt.close(fig)


BIG = torch.randn(100_000)  # 400 KB: more than the whole disk
WRITERS = {
    "torch checkpoint": ("last.pth", lambda p: atomic_save({"w": BIG}, p)),
    "rotating checkpoint": ("last.pth", lambda p: save_rotating({"w": BIG}, p.parent)),
    "safetensors weights": ("model.safetensors", lambda p: save_checkpoint({"w": BIG}, p)),
    "config": ("config.yaml", lambda p: Config().save(p)),
    "report": ("metrics.json", lambda p: write_json({"x": list(range(50_000))}, p)),
    "text": ("summary.md", lambda p: atomic_write_text(p, "x" * 400_000)),
    "figure": ("plot.png", _figure_writer),
}


@pytest.mark.parametrize("fault", ["full", "read-only"])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_failed_write_names_the_path_and_cause_and_keeps_the_previous_file(disk, writer, fault):
    folder, make_fault = disk
    name, write = WRITERS[writer]
    path = folder / name
    path.write_bytes(b"the previous file")
    make_fault(fault)
    with pytest.raises(WriteFailed) as e:
        write(path)
    message = str(e.value)
    cause = {"full": errno.ENOSPC, "read-only": (errno.EROFS, errno.EACCES)}[fault]
    assert str(path) in message and "previous file" in message, message
    assert e.value.errno in (cause if isinstance(cause, tuple) else (cause,)), message
    assert os.strerror(e.value.errno) in message
    assert path.read_bytes() == b"the previous file"
    assert not [p for p in folder.iterdir() if ".tmp" in p.name]


def test_a_folder_where_the_file_goes_is_refused_naming_it(tmp_path):
    (tmp_path / "last.pth").mkdir()
    with pytest.raises(WriteFailed, match=r"cannot write .*last.pth: a folder has that name"):
        atomic_save({"w": BIG}, tmp_path / "last.pth")
    with pytest.raises(WriteFailed, match=r"cannot write .*last.pth: a folder has that name"):
        save_rotating({"w": BIG}, tmp_path)


def test_a_folder_that_cannot_be_created_is_named(tmp_path):
    (tmp_path / "f").write_text("a file")
    with pytest.raises(WriteFailed, match=r"cannot write .*f/run/config.yaml: its folder cannot be created"):
        atomic_write_text(tmp_path / "f" / "run" / "config.yaml", "x")


def test_the_writer_s_own_errors_pass_unchanged(tmp_path):
    with pytest.raises(TypeError):  # not a disk fault: the caller's bug, as raised
        atomic_write_text(tmp_path / "a.txt", lambda f: f.write(3))
    assert not list(tmp_path.iterdir())
