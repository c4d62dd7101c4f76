"""Two gloo processes give the same training as one process with the same global batch."""

import socket

import pytest
import torch
import torch.multiprocessing as mp

from inline_attn.train import checkpoint as ckpt_io
from inline_attn.train.config import Config
from inline_attn.train.task import train

from train_helpers import base_overrides, make_folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, overrides: list) -> None:
    torch.set_num_threads(1)
    train(Config.load(None, overrides), rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")


def test_two_process_gloo_matches_one_process(tmp_path):
    root = make_folder(tmp_path / "imgs", per_class=4)  # 12 train images, global batch 4 -> 3 steps/epoch
    common = {"data.path": str(root), "data.img_size": 16, "sched.epochs": 2, "optim.clip_grad": 1.0}
    one = base_overrides(tmp_path / "one", **common, **{"data.batch_size": 4})
    two = base_overrides(tmp_path / "two", **common, **{"data.batch_size": 2})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        s1 = train(Config.load(None, one))
    finally:
        torch.set_num_threads(threads)
    mp.spawn(_worker, args=(2, _free_port(), two), nprocs=2, join=True)
    a, b = ckpt_io.load(tmp_path / "one" / "last.pth"), ckpt_io.load(tmp_path / "two" / "last.pth")
    assert b["world_size"] == 2 and a["step"] == b["step"] == s1["steps"] == 6
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=1e-4, atol=1e-5)
    for ra, rb in zip(a["history"], b["history"]):
        assert ra["train_loss"] == pytest.approx(rb["train_loss"], rel=1e-5)
        assert ra["val_top1"] == rb["val_top1"] and ra["val_loss"] == pytest.approx(rb["val_loss"], rel=1e-4)
    # rank 0 alone writes (best.pth: the epoch with the best top-1)
    assert sorted(p.name for p in (tmp_path / "two").glob("*.pth")) == ["best.pth", "last.pth", "previous.pth"]
