"""CUDA graphs for segmentation, on the CPU: the segmentor's forward of one kind in both modes, every
head's logits through :class:`~inline_attn.dense.models.segmentor.HeadLogits` (what the graphed step
calls) and their loss (:class:`~inline_attn.dense.models.losses.SegLoss`) equal to the eager loss,
capture-safe (no host read, no shape that depends on the labels), the default ``train.cuda_graphs``,
and a segmentation run
through the graphed path (the capture replaced by eager execution,
:func:`~inline_attn.runtime.graphs.eager_capture`) bit-identical to the ungraphed run with the same
capture-ready optimizer. The capture itself runs only on a GPU (``make gpu-check``)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from inline_attn.dense import build as build_mod
from inline_attn.dense.models import losses as losses_mod
from inline_attn.dense.config import DetConfig, SegConfig
from inline_attn.dense.models.losses import SegLoss
from inline_attn.dense.seg_task import SegTask
from inline_attn.dense.models.segmentor import HeadLogits, SegLogits, build_segmentor
from inline_attn.runtime import run as run_mod
from inline_attn.runtime.graphs import StepGraphs, eager_capture
from inline_attn.runtime.optim import prepare_for_capture
from inline_attn.runtime.run import train

from seg_helpers import make_ade
from test_seg_train import tiny_overrides

K, IGNORE = 5, 255
BACKBONE = {"embed_dims": [8, 8, 16, 16], "num_heads": [1, 1, 1, 1], "mlp_ratios": [2, 2, 2, 2], "depths": [1] * 4}


def _labels(b=2, h=16, w=24, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, K, (b, h, w), generator=gen)
    y[:, :3] = IGNORE  # a band of ignored pixels
    return y


def _logits(b=2, h=16, w=24, seed=1) -> SegLogits:
    gen = torch.Generator().manual_seed(seed)
    return SegLogits(*(torch.randn(b, K, h, w, generator=gen).requires_grad_() for _ in range(2)))


@pytest.mark.parametrize("avg_non_ignore", [False, True])
def test_the_loss_is_the_cross_entropy_of_each_head_weighted(avg_non_ignore):
    logits, y = _logits(), _labels()
    loss = SegLoss(K, IGNORE, 0.4, avg_non_ignore)
    terms = loss.terms(logits, y)

    def ce(z):  # by hand: the per-pixel cross-entropy, ignored pixels 0, over all pixels or the kept ones
        per = F.cross_entropy(z, y, ignore_index=IGNORE, reduction="none")
        return per.sum() / (y != IGNORE).sum() if avg_non_ignore else per.mean()

    assert list(terms) == ["loss_decode", "loss_aux", "loss"]
    assert torch.equal(terms["loss_decode"], ce(logits.decode)) and torch.equal(terms["loss_aux"], ce(logits.aux))
    assert torch.equal(terms["loss"], terms["loss_decode"] + 0.4 * terms["loss_aux"])
    graphed = loss(logits, y)  # what a graphed step minimises first, and its terms
    assert list(graphed) == ["loss", "loss_decode", "loss_aux"]
    assert all(torch.equal(graphed[k], terms[k]) for k in terms)
    no_aux = SegLoss(K, IGNORE, 0.4, avg_non_ignore).terms(SegLogits(logits.decode, None), y)
    assert list(no_aux) == ["loss_decode", "loss"] and torch.equal(no_aux["loss"], terms["loss_decode"])


class _HostReads(TorchDispatchMode):
    """The ops that read a tensor on the host or make a shape from its values."""

    HOST = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "is_nonzero", "item")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if any(name.startswith(h) for h in self.HOST):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("avg_non_ignore", [False, True])
def test_the_graphed_loss_reads_nothing_on_the_host(avg_non_ignore):
    logits, y = _logits(), _labels()
    loss = SegLoss(K, IGNORE, 0.4, avg_non_ignore)
    with _HostReads() as eager:
        loss.terms(logits, y)  # the eager terms check the labels' range: a host read
    assert eager.seen
    with _HostReads() as graphed:
        loss(logits, y)["loss"].backward()
    assert graphed.seen == []
    bad = y.clone()
    bad[0, 5, 5] = K  # the eager loss names a label out of range; the graphed one leaves that to the data sets
    with pytest.raises(ValueError, match=r"values \[5\] outside the 5 classes"):
        loss.terms(logits, bad)


@pytest.mark.parametrize("decode, aux", [("upernet", True), ("semantic_fpn", False)])
def test_the_segmentor_forward_is_one_kind_and_head_logits_give_every_head(decode, aux):
    torch.manual_seed(0)
    model = build_segmentor(
        decode,
        "inline_pvt_tiny",
        num_classes=K,
        channels=8,
        neck_channels=8,
        aux_channels=8,
        backbone_kwargs=dict(BACKBONE, img_size=32),
    )
    x, y = torch.randn(2, 3, 32, 48), _labels(2, 32, 48)
    torch.manual_seed(1)
    trained = model(x)  # training mode: the decode head's logits, as in eval mode
    torch.manual_seed(1)
    assert torch.is_tensor(trained) and torch.equal(trained, model.encode_decode(x))
    heads = HeadLogits(model)  # what the graphed step calls: every head, the segmentor's own parameters
    assert [id(p) for p in heads.parameters()] == [id(p) for p in model.parameters()]
    torch.manual_seed(1)
    out = heads(x)
    assert isinstance(out, SegLogits) and out.decode.shape == (2, K, 32, 48)
    assert (out.aux is not None) is aux and (not aux or out.aux.shape == (2, K, 32, 48))
    torch.manual_seed(1)
    eager = model(x, y)  # the eager training pass: the same terms of the same logits (dropout draws alike)
    terms = model.criterion.terms(out, y)
    assert eager.keys() == terms.keys() and all(torch.equal(eager[k], terms[k]) for k in eager)
    model.eval()
    assert torch.equal(model(x), model.encode_decode(x))  # evaluation: the decode head's logits too


def test_every_dense_task_defaults_to_auto():
    assert SegConfig.load(None).train.cuda_graphs == "auto" and DetConfig.load(None).train.cuda_graphs == "auto"
    assert SegTask.criterion is None and SegTask().build_model(_cfg("unused"), K).criterion is not None
    assert SegTask.criterion_forward is HeadLogits  # the graphed step's criterion takes every head's logits


def _cfg(out, ade=None, **extra) -> SegConfig:
    ov = {"model.dropout": 0.0, "model.decode": "upernet", "model.aux_channels": 8, "sched.iters": 3, **extra}
    if ade is not None:
        ov["data.path"] = ade
    return SegConfig.load(overrides=tiny_overrides(out, **ov))


def test_a_segmentation_run_through_the_graphed_path_is_the_ungraphed_run(
    tmp_path, monkeypatch, capturable_on_cpu, capsys
):
    """The whole run through StepGraphs (the inputs normalised as the task's losses do, the
    capture replaced by eager execution) against the ungraphed run with the same capture-ready
    AdamW: the same weights, optimizer state and losses, bit for bit. Dropout is 0 here: the
    capture's warm-up steps draw from the generator, which a dropout mask would show."""
    ade = str(make_ade(tmp_path / "ade", n_train=4, n_val=2))
    made = []

    def eager_steps(amp, clip_grad):
        made.append(StepGraphs(amp, clip_grad, capture_fn=eager_capture))
        return made[-1]

    with monkeypatch.context() as m:
        m.setattr(run_mod, "why_not_graphed", lambda *a, **k: None)
        m.setattr(run_mod, "StepGraphs", eager_steps)
        graphed = train(SegTask(), _cfg(tmp_path / "graphed", ade, **{"train.cuda_graphs": True}))
    assert "train.cuda_graphs=true: on" in capsys.readouterr().err
    assert made[0].counts()["train_replays"] == 3 and made[0].counts()["train_ungraphed"] == 0
    assert graphed["cuda_graphs"]["graphed"] is True
    summary = json.loads((tmp_path / "graphed" / "summary.json").read_text())
    assert summary["cuda_graphs"]["train_replays"] == 3

    build = build_mod.build_optimizer
    monkeypatch.setattr(build_mod, "build_optimizer", lambda *a, **k: prepare_for_capture(build(*a, **k)))
    ready = train(SegTask(), _cfg(tmp_path / "ready", ade, **{"train.cuda_graphs": False}))
    assert ready["cuda_graphs"]["graphed"] is False
    a, b = (torch.load(tmp_path / n / "last.pth", weights_only=False) for n in ("graphed", "ready"))
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for i, st in a["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(v, b["optimizer"]["state"][i][k]), (i, k)
    keys = ("loss", "loss_decode", "loss_aux")  # every term in the graphed rows too
    assert [[r[k] for k in keys] for r in a["history"]] == [[r[k] for k in keys] for r in b["history"]]
    assert all(r["loss_aux"] is not None for r in a["history"])
    assert isinstance(a["optimizer"]["param_groups"][0]["lr"], float)  # saved in the plain form


def test_the_eager_loss_never_takes_the_graphed_criterion(monkeypatch, tmp_path):
    """An ungraphed run keeps its labels checked: the task's losses are the model's terms."""
    ade = str(make_ade(tmp_path / "ade", n_train=4, n_val=2))
    calls = []
    check = losses_mod.check_labels
    monkeypatch.setattr(losses_mod, "check_labels", lambda *a, **k: calls.append(1) or check(*a, **k))
    train(SegTask(), _cfg(tmp_path / "run", ade, **{"sched.iters": 1}))
    assert len(calls) == 2  # the decode and the auxiliary head's labels, once each
