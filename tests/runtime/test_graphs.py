"""Whole-step CUDA graphs: the capture-safety of a training step, and the fallbacks on CPU.

A CUDA graph replays kernels; anything that reads the device on the host inside the step (a
``.item()``, a ``nonzero``, a device-to-host copy) breaks the capture or freezes a value, and a
step whose op sequence changes between calls cannot be replayed. Two steps of a tiny InLine model
(forward, backward, gradient clipping, AdamW with ``capturable=True``, EMA) are recorded under a dispatch mode and
checked for both. On the CPU the capturable optimizer path is what runs (its device allowlist is
widened for the test) and the fused op runs its Triton kernels under the interpreter; on a GPU
the same test runs natively.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from inline_attn import create_model
from inline_attn.runtime.graphs import GraphedEvalStep, GraphedTrainStep, compile_mode_for, train_step, why_not_graphed
from inline_attn.layers import record_attention
from inline_attn.ops import tokens as tokens_mod
from inline_attn.ops import use_impl
from inline_attn.ops.fused import triton as triton_core
from inline_attn.runtime.ema import ModelEma

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HOST_READS = {"_local_scalar_dense", "item", "nonzero", "is_nonzero", "equal"}


class StepLog(TorchDispatchMode):
    """Every op of a step by name, and the ones that read the device on the host."""

    def __init__(self):
        super().__init__()
        self.names, self.host_reads = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        out = func(*args, **(kwargs or {}))
        self.names.append(name)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        to_host = isinstance(out, torch.Tensor) and out.device.type == "cpu" and any(t.is_cuda for t in tensors)
        if name in HOST_READS or to_host:
            self.host_reads.append(name)
        return out


def _tiny():
    torch.manual_seed(0)
    model = create_model("inline_deit_tiny", img_size=32, num_classes=5, depth=2, embed_dim=48, num_heads=3)
    return model.to(DEVICE)


def test_training_step_is_capture_safe(capturable_on_cpu, monkeypatch):
    # the eager step (the layer cores' autograd.Functions; a dispatch mode would otherwise get the
    # custom op), with the Triton kernels; the interpreter's own tensor copies are not the step's
    monkeypatch.setattr(tokens_mod, "runs_as_custom_op", lambda: False)
    launch = triton_core._launch

    def launch_unseen(*args, **kwargs):
        with _disable_current_modes():
            launch(*args, **kwargs)

    monkeypatch.setattr(triton_core, "_launch", launch_unseen)
    model = _tiny()
    ema = ModelEma(model, decay=0.9)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    x = torch.randn(2, 3, 32, 32, device=DEVICE)
    y = torch.tensor([1, 3], device=DEVICE)
    logs = []
    kw = dict(ema=ema, amp=torch.bfloat16, clip_grad=5.0)
    with use_impl("triton"):
        # a warm-up step, as before a capture: it creates the optimizer state and fills the
        # launchers' caches (on a GPU the fit check plans launches on meta tensors, once a shape)
        train_step(model, opt, F.cross_entropy, x, y, **kw)
        for _ in range(2):
            with StepLog() as log:
                loss = train_step(model, opt, F.cross_entropy, x, y, **kw)
            logs.append(log)
    assert torch.isfinite(loss)
    assert "inline_fwd_fused" not in logs[0].names  # launches are not aten ops; the cores ran as Functions
    for log in logs:
        assert log.host_reads == [], log.host_reads
    assert logs[0].names == logs[1].names
    assert len(logs[0].names) > 100  # the whole step was recorded: forward, backward, optimizer, EMA


def test_why_not_graphed_reasons():
    assert why_not_graphed("cpu") == "CUDA graphs need a CUDA device, the step runs on cpu"
    if not torch.cuda.is_available():
        assert "torch.cuda is not available" in why_not_graphed("cuda")
        return
    model = _tiny()
    assert "dynamic shapes" in why_not_graphed("cuda", static_shapes=False)
    with record_attention(model):
        assert "Python hooks run every step" in why_not_graphed("cuda", model=model)
    opt = torch.optim.AdamW(model.parameters())
    assert "capturable=True" in why_not_graphed("cuda", optimizer=opt)
    assert (
        why_not_graphed("cuda", model=model, optimizer=torch.optim.AdamW(model.parameters(), capturable=True)) is None
    )


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda reported available: why_not_graphed's host logic past the device check (no GPU here)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


def _hooked(kind: str):
    m = torch.nn.Sequential(_linear())
    hook = {
        "forward": lambda: m[0].register_forward_hook(lambda *a: None),
        "forward-pre": lambda: m[0].register_forward_pre_hook(lambda *a: None),
        "backward": lambda: m[0].register_full_backward_hook(lambda *a: None),
        "backward-pre": lambda: m[0].register_full_backward_pre_hook(lambda *a: None),
        "param-grad": lambda: m[0].weight.register_hook(lambda g: g),
        "param-accumulate": lambda: m[0].weight.register_post_accumulate_grad_hook(lambda p: None),
    }[kind]
    hook()
    return m


def _optimizer(kind: str):
    params = _linear().parameters()
    return {
        "adamw": lambda: torch.optim.AdamW(params),
        "adamw-capturable": lambda: torch.optim.AdamW(params, capturable=True),
        "adam-capturable": lambda: torch.optim.Adam(params, capturable=True),
        "rmsprop": lambda: torch.optim.RMSprop(params),
        "sgd": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        "sgd-tensor-lr": lambda: torch.optim.SGD(params, lr=torch.tensor(0.1), momentum=0.9),
        "lbfgs": lambda: torch.optim.LBFGS(params),
        "adagrad": lambda: torch.optim.Adagrad(params),
    }[kind]()


# (id, keyword arguments, the reason's words or None for "can be captured"): every input class
# why_not_graphed separates, with torch.cuda faked as available
_GRAPH_TABLE = [
    ("plain", {}, None),
    ("world-size-2", {"world_size": 2}, "2 processes: DDP's gradient all-reduce"),
    ("dynamic-shapes", {"static_shapes": False}, "dynamic shapes"),
    ("accum-2", {"accum_steps": 2}, "2 accumulation steps"),
    ("amp-fp16", {"amp": "fp16"}, "fp16 loss scaling"),
    ("amp-float16", {"amp": "float16"}, "fp16 loss scaling"),
    ("amp-half", {"amp": "half"}, "fp16 loss scaling"),
    ("amp-auto", {"amp": "auto"}, "fp16 loss scaling"),
    ("amp-torch-float16", {"amp": torch.float16}, "fp16 loss scaling"),
    ("scaler", {"scaler": "enabled"}, "fp16 loss scaling"),
    ("scaler-off", {"scaler": "disabled"}, None),
    ("amp-bf16", {"amp": "bf16"}, None),
    ("amp-bfloat16", {"amp": "bfloat16"}, None),
    ("amp-torch-bfloat16", {"amp": torch.bfloat16}, None),
    ("amp-none", {"amp": "none"}, None),
    ("amp-fp32", {"amp": torch.float32}, None),
    *[
        (f"hook-{k}", {"model": k}, "Python hooks run every step")
        for k in ("forward", "forward-pre", "backward", "backward-pre", "param-grad", "param-accumulate")
    ],
    ("attention-recorder", {"model": "recorder"}, "Python hooks run every step"),
    *[(f"global-{k}", {"global": k}, "global module hooks") for k in ("forward", "forward-pre", "backward")],
    ("adamw", {"optimizer": "adamw"}, "AdamW is not capturable: build it with capturable=True"),
    ("rmsprop", {"optimizer": "rmsprop"}, "RMSprop is not capturable"),
    ("adamw-capturable", {"optimizer": "adamw-capturable"}, None),
    ("adam-capturable", {"optimizer": "adam-capturable"}, None),
    ("sgd", {"optimizer": "sgd"}, None),
    ("sgd-tensor-lr", {"optimizer": "sgd-tensor-lr"}, "SGD reads a tensor lr on the host unless fused"),
    ("lbfgs", {"optimizer": "lbfgs"}, "LBFGS has no capturable mode"),
    ("adagrad", {"optimizer": "adagrad"}, "Adagrad has no capturable mode"),
]

_GLOBAL_HOOKS = {
    "forward": lambda: torch.nn.modules.module.register_module_forward_hook(lambda *a: None),
    "forward-pre": lambda: torch.nn.modules.module.register_module_forward_pre_hook(lambda *a: None),
    "backward": lambda: torch.nn.modules.module.register_module_full_backward_hook(lambda *a: None),
}


@pytest.mark.parametrize("case", _GRAPH_TABLE, ids=[c[0] for c in _GRAPH_TABLE])
def test_why_not_graphed_decision_table(case, fake_cuda, capturable_on_cpu):
    _, kw, words = case
    kw = dict(kw)
    handle = _GLOBAL_HOOKS[kw.pop("global")]() if "global" in kw else None
    recorder = None
    try:
        if kw.get("model") == "recorder":
            kw["model"] = _tiny()
            recorder = record_attention(kw["model"])
            recorder.__enter__()
        elif "model" in kw:
            kw["model"] = _hooked(kw["model"])
        if "scaler" in kw:
            kw["scaler"] = torch.amp.GradScaler("cpu", enabled=kw["scaler"] == "enabled")
        if "optimizer" in kw:
            kw["optimizer"] = _optimizer(kw["optimizer"])
        reason = why_not_graphed("cuda", **kw)
        assert (reason is None) == (words is None) and (words is None or words in reason), reason
        if "optimizer" in kw:
            # "can be captured" means the step reads nothing back on the host (what a capture refuses)
            opt = kw["optimizer"]
            for g in opt.param_groups:
                for p in g["params"]:
                    p.grad = torch.ones_like(p)
            with StepLog() as log:
                opt.step(lambda: torch.zeros(())) if isinstance(opt, torch.optim.LBFGS) else opt.step()
            if reason is None or "on the host" in reason:  # (not capturable: its counter stays on the CPU)
                assert (log.host_reads == []) == (reason is None), log.host_reads
    finally:
        if recorder is not None:
            recorder.__exit__(None, None, None)
        if handle is not None:
            handle.remove()


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"world_size": 0}, r"world_size=0: expected an integer >= 1"),
        ({"world_size": -1}, r"world_size=-1: expected an integer >= 1"),
        ({"world_size": 1.5}, r"world_size=1.5: expected an integer >= 1"),
        ({"accum_steps": 0}, r"accum_steps=0: expected an integer >= 1"),
        ({"accum_steps": True}, r"accum_steps=True: expected an integer >= 1"),
        ({"amp": "fp8"}, r"amp='fp8': expected None, one of"),
        ({"amp": "FP16"}, r"amp='FP16': expected None, one of"),
        ({"amp": torch.int8}, r"amp=torch.int8: expected None, one of"),
        ({"model": "resnet"}, r"model=str: expected a torch.nn.modules.module.Module or None"),
        ({"optimizer": "adamw"}, r"optimizer=str: expected a torch.optim.optimizer.Optimizer or None"),
        ({"scaler": True}, r"scaler=bool: expected a torch.amp.GradScaler \(is_enabled\(\)\) or None"),
    ],
    ids=lambda v: str(v) if not isinstance(v, dict) else next(iter(v)) + "=" + str(next(iter(v.values()))),
)
def test_why_not_graphed_refuses_invalid_arguments(kw, match, fake_cuda):
    with pytest.raises(ValueError, match=match):
        why_not_graphed("cuda", **kw)
    with pytest.raises(ValueError, match="device='gpu': expected a torch device"):
        why_not_graphed("gpu")


def test_compile_mode_for_cuda_graphs():
    assert compile_mode_for("default", cuda_graphs=True) == "reduce-overhead"
    assert compile_mode_for("max-autotune-no-cudagraphs", cuda_graphs=True) == "max-autotune"
    assert compile_mode_for("default", cuda_graphs=False) == "default"
    with pytest.raises(ValueError, match="unknown compile mode"):
        compile_mode_for("fast", cuda_graphs=True)


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU fallback")
def test_graphed_steps_fall_back_on_cpu_and_train():
    model = _tiny()
    ref = _tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 3])
    step = GraphedTrainStep(model, opt, F.cross_entropy, x, y)
    assert step.why_not == "CUDA graphs need a CUDA device, the step runs on cpu"
    for i in range(2):
        torch.manual_seed(i)  # the same stochastic-depth draws on both sides
        loss = step(x, y)
        torch.manual_seed(i)
        ref_loss = train_step(ref, ref_opt, F.cross_entropy, x, y)
    torch.testing.assert_close(loss, ref_loss)  # the plain step, nothing captured or skipped
    evaluate = GraphedEvalStep(model.eval(), x)
    assert evaluate.why_not is not None
    torch.testing.assert_close(evaluate(x), model(x))


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU")
def test_graphed_training_step_matches_the_plain_step_on_cuda():
    model, ref = _tiny().eval(), _tiny().eval()  # no stochastic-depth draws: both sides compute the same
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, capturable=True)
    ema, ref_ema = ModelEma(model, decay=0.9), ModelEma(ref, decay=0.9)
    x = torch.randn(4, 3, 32, 32, device=DEVICE)
    y = torch.tensor([1, 3, 0, 2], device=DEVICE)
    step = GraphedTrainStep(model, opt, F.cross_entropy, x, y, ema=ema)
    assert step.why_not is None
    for i in range(3):
        xi = x + 0.1 * i
        loss = step(xi, y).clone()
        ref_loss = train_step(ref, ref_opt, F.cross_entropy, xi, y, ema=ref_ema)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-5)
    for p, q in zip(ema.parameters(), ref_ema.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU")
def test_trainer_step_graphs_match_the_plain_steps_on_cuda():
    """train.cuda_graphs' StepGraphs with the real capture: bf16, clipping, the optimizer made
    capturable (tensor lr the schedule writes between replays), the EMA, a smaller batch run
    ungraphed, and the evaluation forward; against the plain steps on the same optimizer."""
    from inline_attn.runtime.optim import CosineSchedule, build_optimizer, prepare_for_capture
    from types import SimpleNamespace

    from inline_attn.runtime.graphs import StepGraphs
    from inline_attn.train.evaluate import soft_cross_entropy

    def state():
        model = _tiny().eval()  # no stochastic-depth draws: both sides compute the same
        opt = build_optimizer(model, "adamw", 1e-3, 0.05)
        sched = CosineSchedule(opt, lr=1e-3, steps_per_epoch=3, epochs=2, warmup_epochs=1, warmup_lr=1e-5)
        return SimpleNamespace(model=model, optimizer=opt, sched=sched, ema=ModelEma(model, 0.9))

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    batches = []
    for b in (4, 4, 3, 4, 4):  # a smaller batch between full ones
        x = torch.randn(b, 3, 32, 32, device=DEVICE, generator=gen)
        batches.append((x, torch.softmax(torch.randn(b, 5, device=DEVICE, generator=gen), -1)))
    graphed, plain = state(), state()
    prepare_for_capture(plain.optimizer)
    graphs = StepGraphs("bf16", 1.0)
    for x, t in batches:
        loss = graphs.train_step(graphed.model, graphed.optimizer, graphed.ema, soft_cross_entropy, x, t).clone()
        graphed.sched.step()
        ref = train_step(
            plain.model, plain.optimizer, soft_cross_entropy, x, t, ema=plain.ema, amp=torch.bfloat16, clip_grad=1.0
        )
        plain.sched.step()
        torch.testing.assert_close(loss, ref, rtol=1e-3, atol=1e-4)
    counts = graphs.counts()
    assert counts["train_why_not"] is None and counts["train_replays"] == 4 and counts["train_ungraphed"] == 1
    for p, q in zip(graphed.ema.module.parameters(), plain.ema.module.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)
    forward = graphs.eval_forward(graphed.model)
    for x, _ in batches[:3]:
        with torch.no_grad():
            torch.testing.assert_close(forward(x), graphed.model(x))
    assert graphs.counts()["eval_replays"] == 2 and graphs.counts()["eval_ungraphed"] == 1
