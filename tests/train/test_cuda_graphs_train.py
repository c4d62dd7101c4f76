"""``train.cuda_graphs``: the setting, the fallbacks, the tensor learning rate and the graphed
trainer's host logic, on the CPU.

What is checked here is everything around the capture: the config field, the decision table
(:func:`inline_attn.runtime.graphs.why_not_graphed`, :func:`inline_attn.runtime.graphs.graphs_line`), the CPU
run that asked for graphs being bit-identical to the one that did not, the optimizer made ready
for capture (tensor lr written in place by the schedule, capturable AdamW, fused SGD, checkpoints
in the plain form) and the graphed step's orchestration (static buffers, copy-in, the warm-up
undone, another shape run ungraphed, the EMA updated inside the step, the evaluation forward) with
the capture replaced by eager execution (:func:`inline_attn.runtime.graphs.eager_capture`). The
capture and replay themselves run only on a GPU: ``make gpu-check`` (its ``train`` step).
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

from inline_attn.runtime import graphs as graphs_mod
from inline_attn.runtime.graphs import (
    GraphedTrainStep,
    StepGraphs,
    eager_capture,
    graphs_line,
    train_step,
    why_not_graphed,
)
from inline_attn.runtime.ema import ModelEma
from inline_attn.runtime.optim import (
    CosineSchedule,
    build_optimizer,
    plain_state_dict,
    prepare_for_capture,
    set_lr,
)
from inline_attn.runtime import run as run_mod
from inline_attn.train import task as task_mod
from inline_attn.train.config import Config
from inline_attn.train.task import train
from inline_attn.train.evaluate import soft_cross_entropy
from types import SimpleNamespace

from train_helpers import base_overrides, make_fmnist

CPU = torch.device("cpu")
CUDA = torch.device("cuda")


# --- (a) the setting


def test_setting_defaults_to_auto_and_takes_booleans():
    assert Config.load(None).train.cuda_graphs == "auto"
    for value in (True, False, "auto"):
        got = Config.load(None, [("train.cuda_graphs", value)]).train.cuda_graphs
        assert got == value and type(got) is type(value)
    # how a run is executed, not what it trains: a resume may change it
    cfg = Config.load(None, [("train.cuda_graphs", False)])
    assert cfg.differences(Config.load(None).to_dict()) == []


@pytest.mark.parametrize("bad", [1, 0, 1.0, "on", "yes", "always", None, [True]])
def test_setting_refuses_other_values_naming_them(bad):
    with pytest.raises(ValueError, match=r"train\.cuda_graphs=.*expected one of 'auto', true, false"):
        Config.load(None, [("train.cuda_graphs", bad)])


# --- (e) the decision table


class _Scaler:
    def __init__(self, enabled):
        self.enabled = enabled

    def is_enabled(self):
        return self.enabled


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3))


def test_why_not_graphed_decision_table(monkeypatch):
    assert why_not_graphed("cpu") == "CUDA graphs need a CUDA device, the step runs on cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert why_not_graphed("cuda") == "CUDA graphs need a CUDA device, and torch.cuda is not available"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the rest is host logic
    net = _net()
    capturable = torch.optim.AdamW(net.parameters(), capturable=True)
    assert why_not_graphed("cuda", model=net, optimizer=capturable) is None
    assert why_not_graphed("cuda", amp="bf16") is None and why_not_graphed("cuda", amp=torch.bfloat16) is None
    assert why_not_graphed("cuda", amp="none") is None and why_not_graphed("cuda", scaler=_Scaler(False)) is None
    rows = [
        (dict(world_size=2), "2 processes: DDP's gradient all-reduce is not captured"),
        (dict(static_shapes=False), "dynamic shapes"),
        (dict(accum_steps=4), "4 accumulation steps: a captured step is one micro-batch"),
        (dict(amp="fp16"), "fp16 loss scaling checks for inf on the host every step: use bf16"),
        (dict(amp=torch.float16), "fp16 loss scaling"),
        (dict(scaler=_Scaler(True)), "fp16 loss scaling"),
        (dict(optimizer=torch.optim.AdamW(net.parameters())), "AdamW is not capturable: build it with capturable=True"),
        (
            dict(optimizer=torch.optim.SGD(net.parameters(), lr=torch.tensor(0.1))),
            "SGD reads a tensor lr on the host unless fused",
        ),
    ]
    for kwargs, reason in rows:
        got = why_not_graphed("cuda", **kwargs)
        assert got is not None and reason in got and "\n" not in got, (kwargs, got)
    assert why_not_graphed("cuda", optimizer=torch.optim.SGD(net.parameters(), lr=0.1)) is None  # a float lr is baked
    fused_sgd = torch.optim.SGD(net.parameters(), lr=torch.tensor(0.1), fused=True)
    assert why_not_graphed("cuda", optimizer=fused_sgd) is None
    handle = net[0].register_forward_hook(lambda *a: None)
    assert "Python hooks run every step on ['0']" in why_not_graphed("cuda", model=net)
    handle.remove()
    # the first reason that applies is the one given: the order is the docstring's
    assert "2 processes" in why_not_graphed("cuda", world_size=2, accum_steps=2, amp="fp16")
    assert "accumulation" in why_not_graphed("cuda", accum_steps=2, amp="fp16")


def test_trainer_decision_and_its_one_line(monkeypatch):
    net = _net()
    # on CUDA the trainer's AdamW is fused (capture-safe); here its parameters stay on the CPU
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, fused=True)
    common = dict(amp="none", accum_steps=1, world_size=1, compile=False, model=net, optimizer=opt)
    reason = why_not_graphed(CPU, **common)
    assert reason == "CUDA graphs need a CUDA device, the step runs on cpu"
    # auto on the CPU says nothing (a CPU run prints what it printed before); true says why
    assert graphs_line("auto", False, reason, CPU, False) is None
    assert graphs_line(True, False, reason, CPU, False) == (
        "train.cuda_graphs=true: running ungraphed: CUDA graphs need a CUDA device, the step runs on cpu"
    )
    assert graphs_line(False, False, None, CUDA, False) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert why_not_graphed(CUDA, **common) is None
    assert graphs_line("auto", True, None, CUDA, False) == "train.cuda_graphs=auto: on (steps captured in CUDA graphs)"
    for change, words in (
        (dict(amp="fp16"), "fp16"),
        (dict(amp="auto"), "fp16"),
        (dict(accum_steps=2), "accumulation"),
        (dict(world_size=2), "processes"),
        (dict(optimizer=torch.optim.RMSprop(net.parameters())), "RMSprop is not capturable"),
        (dict(optimizer=torch.optim.AdamW(net.parameters(), differentiable=True)), "differentiable AdamW"),
        (dict(optimizer=torch.optim.AdamW(net.parameters())), "capturable=True"),
    ):
        reason = why_not_graphed(CUDA, **{**common, **change})
        assert reason is not None and words in reason
        assert graphs_line("auto", False, reason, CUDA, False).startswith("train.cuda_graphs=auto: running ungraphed: ")
    # with torch.compile inductor's reduce-overhead mode graphs the model: only device and processes count
    assert why_not_graphed(CUDA, **{**common, "compile": True, "amp": "fp16", "accum_steps": 2}) is None
    assert why_not_graphed(CUDA, **{**common, "compile": True, "world_size": 2}) is not None
    assert "reduce-overhead" in graphs_line(True, True, None, CUDA, True)


def test_adamw_is_fused_on_cuda_only(monkeypatch):
    """build_optimizer gives AdamW its fused, capture-safe kernel where the parameters are on CUDA,
    and the plain implementation elsewhere (a CPU run computes what it computed before)."""
    net = _net()
    assert not build_optimizer(net, "adamw", 1e-3, 0.05).param_groups[0].get("fused")
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    groups = build_optimizer(net, "adamw", 1e-3, 0.05).param_groups
    assert all(g["fused"] for g in groups)
    assert not build_optimizer(net, "sgd", 1e-3, 0.05).param_groups[0].get("fused")


# --- (b) asked for on the CPU: one line, and the same run as without


def _fmnist_overrides(tmp_path, out, **extra):
    root = tmp_path / "fm"
    if not root.exists():
        make_fmnist(root, n_train=16, n_test=70)  # eval batches of 64 and a last one of 6
    ov = {
        "data.dataset": "fmnist",
        "data.path": str(root),
        "aug.crop": "pad",
        "aug.hflip": 0.5,
        "train.ema": True,
        "train.ema_decay": 0.9,
        "sched.epochs": 2,
        "sched.warmup_epochs": 1,
        "train.device": "cpu",  # also on a GPU machine: these runs check the CPU side
        **extra,
    }
    return base_overrides(out, **ov)


def _weights(out):
    return torch.load(out / "last.pth", weights_only=False)


def _same_run(a, b):
    assert a["final"] == b["final"]
    wa, wb = _weights(a["output_dir"]), _weights(b["output_dir"])
    for part in ("model", "model_ema"):
        for k in wa[part]:
            assert torch.equal(wa[part][k], wb[part][k]), (part, k)
    for i, st in wa["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(v, wb["optimizer"]["state"][i][k]), (i, k)
    assert wa["optimizer"]["param_groups"] == wb["optimizer"]["param_groups"]


def _run(tmp_path, name, **extra):
    out = tmp_path / name
    summary = train(Config.load(None, _fmnist_overrides(tmp_path, out, **extra)))
    summary["output_dir"] = out
    return summary


def test_true_on_cpu_says_why_in_one_line_and_trains_as_false(tmp_path, capsys):
    off = _run(tmp_path, "off", **{"train.cuda_graphs": False})
    assert "cuda_graphs" not in capsys.readouterr().err
    asked = _run(tmp_path, "asked", **{"train.cuda_graphs": True})
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "cuda_graphs" in ln]
    assert lines == ["train.cuda_graphs=true: running ungraphed: CUDA graphs need a CUDA device, the step runs on cpu"]
    _same_run(off, asked)
    auto = _run(tmp_path, "auto")  # the default: silent on the CPU
    assert "cuda_graphs" not in capsys.readouterr().err
    _same_run(off, auto)
    summary = json.loads((tmp_path / "asked" / "summary.json").read_text())
    assert summary["cuda_graphs"] == {
        "setting": True,
        "graphed": False,
        "why_not": "CUDA graphs need a CUDA device, the step runs on cpu",
    }
    assert json.loads((tmp_path / "off" / "summary.json").read_text())["cuda_graphs"]["why_not"] is None


# --- (c) the tensor learning rate the schedule writes in place


def _trajectory(opt_name, *, lr_tensor=None, prepare=False, steps=6):
    """Parameters after each step of the real optimizer and cosine schedule (warm-up, so the lr
    changes every step) on a fixed batch."""
    net = _net()
    opt = build_optimizer(net, opt_name, 1e-2, 0.05)
    if lr_tensor is not None:
        for g in opt.param_groups:
            g["lr"] = torch.tensor(g["lr"], dtype=lr_tensor)
            g["foreach"] = False  # torch refuses a tensor lr on the foreach path unless capturable
    if prepare:
        prepare_for_capture(opt)
    sched = CosineSchedule(opt, lr=1e-2, steps_per_epoch=steps, epochs=2, warmup_epochs=1, warmup_lr=1e-4, min_lr=1e-5)
    lrs = [g["lr"] for g in opt.param_groups]
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen)
    out = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        sched.step()
        out.append([p.detach().clone() for p in net.parameters()])
    if lr_tensor is not None or prepare:
        assert all(a is b for a, b in zip(lrs, (g["lr"] for g in opt.param_groups)))  # written in place
        assert all(float(g["lr"]) == pytest.approx(sched.get_last_lr(), rel=1e-6) for g in opt.param_groups)
    return out, opt


@pytest.mark.parametrize("opt_name", ["adamw", "sgd"])
def test_tensor_lr_written_in_place_follows_the_float_schedule_exactly(opt_name):
    floats, _ = _trajectory(opt_name)
    tensors, _ = _trajectory(opt_name, lr_tensor=torch.float64)
    for a, b in zip(floats, tensors):
        for p, q in zip(a, b):
            assert torch.equal(p, q)
    # a warm-up lr that did not reach the optimizer would show: the first and last steps differ
    assert not torch.equal(floats[0][0], floats[-1][0])


@pytest.mark.parametrize("opt_name", ["adamw", "sgd"])
def test_optimizer_prepared_for_capture_stays_on_the_plain_trajectory(opt_name, capturable_on_cpu):
    floats, _ = _trajectory(opt_name)
    prepared, opt = _trajectory(opt_name, prepare=True)
    group = opt.param_groups[0]
    assert group["lr"].dtype == torch.float32 and group["lr"].dim() == 0
    if opt_name == "adamw":
        assert group["capturable"] is True and opt.state[group["params"][0]]["step"].device == CPU
    else:
        assert group["fused"] is True
    # the same algorithm in float32 arithmetic for the bias corrections and the lr
    for a, b in zip(floats, prepared):
        for p, q in zip(a, b):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opt_name", ["adamw", "sgd"])
def test_prepared_optimizer_saves_as_the_plain_one(opt_name, capturable_on_cpu):
    _, plain = _trajectory(opt_name)
    _, prepared = _trajectory(opt_name, prepare=True)
    assert prepare_for_capture(prepared) is prepared  # idempotent
    a, b = plain.state_dict(), plain_state_dict(prepared)
    unchanged = plain_state_dict(plain)  # never prepared: its own state_dict
    assert unchanged["param_groups"] == a["param_groups"] and unchanged["state"].keys() == a["state"].keys()
    assert [set(g) for g in a["param_groups"]] == [set(g) for g in b["param_groups"]]
    for ga, gb in zip(a["param_groups"], b["param_groups"]):
        assert isinstance(gb["lr"], float) and gb["lr"] == pytest.approx(ga["lr"], rel=1e-6)
        assert {k: v for k, v in ga.items() if k != "lr"} == {k: v for k, v in gb.items() if k != "lr"}
    for i, st in b["state"].items():
        assert st.keys() == a["state"][i].keys()
        if "step" in st:
            assert st["step"].device == CPU and st["step"] == a["state"][i]["step"]
    fresh = build_optimizer(_net(), opt_name, 1e-2, 0.05)
    fresh.load_state_dict(b)  # a plain run resumes from it
    assert not torch.is_tensor(fresh.param_groups[0]["lr"])
    assert fresh.param_groups[0].get("capturable", False) is False and not fresh.param_groups[0].get("fused")


def test_set_lr_replaces_floats_and_fills_tensors():
    net = _net()
    opt = torch.optim.SGD([{"params": [net[0].weight]}, {"params": [net[2].weight], "lr": torch.tensor(0.5)}], lr=0.1)
    tensor = opt.param_groups[1]["lr"]
    set_lr(opt, 0.25)
    assert opt.param_groups[0]["lr"] == 0.25 and opt.param_groups[1]["lr"] is tensor and float(tensor) == 0.25


# --- (d) the graphed step's host logic, the capture replaced by eager execution


def _tiny_state(ema=True):
    net = _net()
    opt = build_optimizer(net, "adamw", 1e-2, 0.05)
    sched = CosineSchedule(opt, lr=1e-2, steps_per_epoch=4, epochs=2, warmup_epochs=1, warmup_lr=1e-4, min_lr=1e-5)
    return SimpleNamespace(model=net, optimizer=opt, sched=sched, ema=ModelEma(net, 0.9) if ema else None)


def _batches(n=5, b=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        x = torch.randn(b, 6, generator=gen)
        t = torch.softmax(torch.randn(b, 3, generator=gen), -1)
        out.append((x, t))
    return out


def _graphed_run(state, batches, capture_fn):
    graphs = StepGraphs("none", 1.0, capture_fn=capture_fn)
    losses = []
    for x, t in batches:
        losses.append(graphs.train_step(state.model, state.optimizer, state.ema, soft_cross_entropy, x, t).item())
        state.sched.step()
    return graphs, losses


def _plain_run(state, batches):
    prepare_for_capture(state.optimizer)  # the same optimizer as the graphed run's
    losses = []
    for x, t in batches:
        loss = train_step(state.model, state.optimizer, soft_cross_entropy, x, t, ema=state.ema, clip_grad=1.0)
        losses.append(loss.item())
        state.sched.step()
    return losses


def _params_equal(a: nn.Module, b: nn.Module):
    for (n, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), n


def test_graphed_step_host_logic_matches_the_plain_step_bit_for_bit(capturable_on_cpu):
    calls = []

    def counted_capture(fn, *, warmup=3, pool=None):
        calls.append(warmup)
        return eager_capture(fn, warmup=warmup, pool=pool)

    batches = _batches()
    plain = _tiny_state()
    plain_losses = _plain_run(plain, batches)
    graphed = _tiny_state()
    graphs, losses = _graphed_run(graphed, batches, counted_capture)
    # captured once (3 warm-up steps and the capture call, all undone), then every batch replayed
    assert calls == [3] and graphs.train.why_not is None
    assert graphs.counts() == {
        "train_replays": 5,
        "train_ungraphed": 0,
        "train_why_not": None,
        "eval_replays": 0,
        "eval_ungraphed": 0,
    }
    assert losses == plain_losses
    _params_equal(plain.model, graphed.model)
    _params_equal(plain.ema.module, graphed.ema.module)  # the EMA updated after each step, inside it
    for p, q in zip(plain.model.parameters(), graphed.model.parameters()):
        for k, v in plain.optimizer.state[p].items():
            assert torch.equal(v, graphed.optimizer.state[q][k]), k


def test_another_shape_runs_ungraphed_on_the_same_state(capturable_on_cpu):
    batches = _batches(4, b=8)
    small = _batches(1, b=5, seed=3)[0]  # a smaller batch, e.g. the last one
    order = [batches[0], batches[1], small, batches[2], batches[3]]
    plain = _tiny_state()
    plain_losses = _plain_run(plain, order)
    graphed = _tiny_state()
    graphs, losses = _graphed_run(graphed, order, eager_capture)
    counts = graphs.counts()
    assert counts["train_replays"] == 4 and counts["train_ungraphed"] == 1
    assert losses == plain_losses
    _params_equal(plain.model, graphed.model)
    _params_equal(plain.ema.module, graphed.ema.module)


def test_static_buffers_take_each_batch_and_the_loss_is_a_static_tensor(capturable_on_cpu):
    state = _tiny_state(ema=False)
    prepare_for_capture(state.optimizer)
    (x0, t0), (x1, t1) = _batches(2)
    step = GraphedTrainStep(
        state.model, state.optimizer, soft_cross_entropy, x0, t0, why_not=None, capture_fn=eager_capture
    )
    assert step._inputs is not x0 and torch.equal(step._inputs, x0)  # a buffer of its own
    first = step(x1, t1)
    assert torch.equal(step._inputs, x1) and torch.equal(step._targets, t1)  # copied in
    value = first.item()
    second = step(x0, t0)
    assert second is first and second.item() != value  # overwritten by the next replay: read it before


def test_a_failed_capture_restores_the_state_and_runs_ungraphed(capturable_on_cpu):
    def failing_capture(fn, *, warmup=3, pool=None):
        for _ in range(warmup):
            fn()  # the warm-up changed the weights before the capture failed
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    batches = _batches(3)
    plain = _tiny_state()
    plain_losses = _plain_run(plain, batches)
    graphed = _tiny_state()
    graphs, losses = _graphed_run(graphed, batches, failing_capture)
    assert graphs.train.why_not == "capture failed: RuntimeError: operation not permitted when stream is capturing"
    assert graphs.counts()["train_replays"] == 0
    assert losses == plain_losses
    _params_equal(plain.model, graphed.model)


def test_trainer_with_graphs_forced_on_the_cpu_runs_the_graphed_path(tmp_path, monkeypatch, capturable_on_cpu, capsys):
    """The whole trainer through StepGraphs (config -> plan -> runner -> evaluate -> checkpoint ->
    summary) with the capture replaced by eager execution; against the ungraphed trainer with the
    same capture-ready optimizer it is bit-identical, and against the plain one close."""
    made = []

    def eager_steps(amp, clip_grad):
        made.append(StepGraphs(amp, clip_grad, capture_fn=eager_capture))
        return made[-1]

    forced = _run_forced(tmp_path, monkeypatch, eager_steps)
    assert "train.cuda_graphs=true: on (steps captured in CUDA graphs)" in capsys.readouterr().err
    counts = made[0].counts()
    assert counts["train_replays"] == 8 and counts["train_ungraphed"] == 0  # 2 epochs of 4 steps
    # evaluation: 2 epochs x (model, EMA) x (a batch of 64 replayed, the last of 6 ungraphed)
    assert counts["eval_replays"] == 4 and counts["eval_ungraphed"] == 4
    summary = json.loads((tmp_path / "forced" / "summary.json").read_text())
    assert summary["cuda_graphs"]["graphed"] is True and summary["cuda_graphs"]["train_replays"] == 8
    # the checkpoint holds the optimizer in the plain form
    group = _weights(tmp_path / "forced")["optimizer"]["param_groups"][0]
    assert isinstance(group["lr"], float) and group["capturable"] is False

    # the same optimizer, ungraphed: the trainer's own step with a capture-ready AdamW
    build = task_mod.build_optimizer
    monkeypatch.setattr(task_mod, "build_optimizer", lambda *a, **k: prepare_for_capture(build(*a, **k)))
    ready = _run(tmp_path, "ready", **{"train.cuda_graphs": False})
    monkeypatch.setattr(task_mod, "build_optimizer", build)
    _same_run(forced, ready)
    plain = _run(tmp_path, "plain", **{"train.cuda_graphs": False})
    for key in ("train_loss", "val_loss"):
        assert forced["final"][key] == pytest.approx(plain["final"][key], rel=1e-4)


def _run_forced(tmp_path, monkeypatch, make_graphs):
    monkeypatch.setattr(run_mod, "why_not_graphed", lambda *a, **k: None)
    monkeypatch.setattr(run_mod, "StepGraphs", make_graphs)
    return _run(tmp_path, "forced", **{"train.cuda_graphs": True})


def test_the_trainer_captures_beside_the_loader_threads(monkeypatch):
    # a data loader's pin-memory thread may allocate page-locked memory during the capture: the
    # trainer captures in the thread_local error mode (the capture itself needs a GPU)
    seen = []
    monkeypatch.setattr(graphs_mod, "capture", lambda fn, **kw: seen.append(kw) or ("replay", "graph"))
    assert StepGraphs("bf16", None).capture_fn is graphs_mod.capture_beside_loader
    assert graphs_mod.capture_beside_loader(lambda: None, warmup=2) == ("replay", "graph")
    assert seen == [{"warmup": 2, "pool": None, "capture_error_mode": "thread_local"}]
