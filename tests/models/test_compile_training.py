"""``torch.compile`` traces InLine's training step whole: no graph break in the layer or in
InLine-DeiT (train mode, drop path on, float32 and bf16 autocast), on the fused impls a GPU runs
(``triton``, here under Triton's interpreter) and the CPU runs (``cpu``); the backward is one
graph holding the fused backward op; a second step compiles nothing new.

The backend is AOT autograd with counting compilers that run the graphs eagerly: dynamo and AOT
autograd trace as under inductor, without inductor's code generation (seconds per graph on these
CPUs). A graph break would show as a second forward graph, with its reason in dynamo's counters.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters

from inline_attn import create_model
from inline_attn.layers import build_attention
from inline_attn.ops import use_impl

AMPS = {"fp32": None, "bf16": torch.bfloat16}


class GraphCounter:
    """A ``torch.compile`` backend (AOT autograd, run eagerly) that keeps every forward and
    backward graph's call targets, one set per graph."""

    def __init__(self):
        self.forward: list[set[str]] = []
        self.backward: list[set[str]] = []

    def _keep(self, graphs):
        def compiler(gm, example_inputs):
            graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
            return make_boxed_func(gm.forward)

        return compiler

    def backend(self):
        return aot_autograd(fw_compiler=self._keep(self.forward), bw_compiler=self._keep(self.backward))


def _layer_case():
    layer = build_attention("inline", 48, 3, num_prefix_tokens=1, attn_drop=0.1, proj_drop=0.1)
    x = torch.randn(2, 1 + 5 * 6, 48)
    return layer, (x, (5, 6))


def _deit_case():
    model = create_model(
        "inline_deit_tiny", img_size=32, num_classes=5, depth=1, embed_dim=48, num_heads=3, drop_path_rate=0.1
    )
    return model, (torch.randn(2, 3, 32, 32),)


CASES = {"layer": _layer_case, "inline_deit": _deit_case}


def _train_step(module, args, amp):
    def step(*args):
        with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
            return module(*args)

    return step


# the GPU's path (triton, bf16 autocast) on the model; the CPU's on the layer and the model. Triton's
# interpreter takes about 20 s for a model's two steps, so its layer alone is not run again here.
COMBOS = [
    ("inline_deit", "triton", "bf16"),
    ("inline_deit", "cpu", "fp32"),
    ("layer", "cpu", "fp32"),
    ("layer", "cpu", "bf16"),
]


@pytest.mark.parametrize("case,impl,amp", COMBOS)
def test_training_step_compiles_without_graph_breaks(case, impl, amp):
    if impl == "triton":
        pytest.importorskip("triton")
    torch._dynamo.reset()
    counters["graph_break"].clear()
    module, args = CASES[case]()
    module.train()
    counter = GraphCounter()
    compiled = torch.compile(_train_step(module, args, AMPS[amp]), backend=counter.backend())
    with use_impl(impl):
        for _ in range(2):  # the second step reuses the first one's graphs
            module.zero_grad(set_to_none=True)
            compiled(*args).float().square().mean().backward()
    breaks = dict(counters["graph_break"])
    assert not breaks and (len(counter.forward), len(counter.backward)) == (1, 1), breaks
    assert "inline_attn.inline_forward.default" in counter.forward[0]
    assert "inline_attn.inline_backward.default" in counter.backward[0]
    grads = [p.grad for p in module.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
