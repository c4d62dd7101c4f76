"""An analysis of a checkpoint whose weights hold NaN or inf stops before any work, naming the file and
the tensor (it used to report "ratio nan" and "injective: yes"); a finite checkpoint still runs."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch

from inline_attn import create_model
from inline_attn.cli import main
from inline_attn.runtime.finite import NonFiniteOutputs, require_finite_weights

DEIT = dict(img_size=28, patch_size=7, embed_dim=16, depth=1, num_heads=2, in_chans=1, num_classes=10)
ARGS = [f"{k}={v}" for k, v in DEIT.items()]


@pytest.fixture(scope="module")
def fmnist(tmp_path_factory):
    root = tmp_path_factory.mktemp("fmnist")
    for name, arr in (("images", np.zeros((4, 28, 28))), ("labels", np.arange(4))):
        header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}i", *arr.shape)
        with gzip.open(root / f"t10k-{name}-idx{arr.ndim}-ubyte.gz", "wb") as f:
            f.write(header + arr.astype(np.uint8).tobytes())
    return root


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    model = create_model("inline_deit_tiny", **DEIT)
    torch.save({"model": model.state_dict()}, root / "finite.pth")
    for bad in ("nan", "inf"):
        state = {k: v.clone() for k, v in model.state_dict().items()}
        state["blocks.0.attn.qkv.weight"][0, 0] = float(bad)
        torch.save({"model": state}, root / f"{bad}.pth")
    return root


ANALYSES = ["locality", "confusion", "masking", "attention-maps"]


@pytest.mark.parametrize("bad", ["nan", "inf"])
@pytest.mark.parametrize("analysis", ANALYSES)
def test_an_analysis_of_a_non_finite_checkpoint_is_refused(tmp_path, capsys, fmnist, checkpoints, analysis, bad):
    ck = checkpoints / f"{bad}.pth"
    argv = ["analyze", analysis, "--model", "inline_deit_tiny", "--checkpoint", str(ck), "--model-args", *ARGS]
    argv += ["--data", f"fmnist:{fmnist}", "--out", str(tmp_path / "out"), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {ck}: 1 of the" in err and "blocks.0.attn.qkv.weight are NaN or inf" in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_finite_checkpoint_is_analysed(tmp_path, fmnist, checkpoints):
    argv = ["analyze", "locality", "--model", "inline_deit_tiny", "--checkpoint", str(checkpoints / "finite.pth")]
    argv += ["--model-args", *ARGS, "--data", f"fmnist:{fmnist}", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 0 and (tmp_path / "locality.csv").is_file()


def test_non_finite_buffers_count_and_integer_ones_are_skipped():
    model = torch.nn.BatchNorm1d(3)
    require_finite_weights(model, "m")  # num_batches_tracked is an integer buffer
    model.running_var[1] = float("nan")
    with pytest.raises(NonFiniteOutputs, match=r"m: 1 of the 3 values of running_var are NaN or inf"):
        require_finite_weights(model, "m")
