"""``torch.compile`` of the Triton backend on CUDA tensors traces into the kernels, no GPU needed.

Under ``torch.compile`` on CUDA tensors the layer core is the ``triton_op`` pair
``inline_attn::kernels_forward`` / ``kernels_backward``: AOT autograd traces through their launchers,
and each launch becomes a ``triton_kernel_wrapper_functional`` node of the kernel's flat twin, which
the compiled graph launches itself (no custom op, no launcher Python at run time). Inductor reads from
each twin's Triton IR which tensors it writes: only the outputs are cloned, never q, k, v, the taps or
the upstream gradient.

Checked here without a GPU: this file runs itself in a subprocess (``TRITON_INTERPRET=0``; this
process interprets) where dynamo compiles ``inline_core`` on fake CUDA tensors, Triton compiles for
sm_90 through a stand-in driver (``tools.kernel_audit.compiling_for``), and the launchers plan for an
H100's limits. Inference graphs only: autograd cannot record fake CUDA tensors in a CPU build of
torch, so the backward op is traced on its own. Inductor's lowering itself needs a GPU (gpu-check's
compile step runs it).

Dynamo traces here as torch 2.11's does (the GPU machines' torch): it answers
``torch.compiler.is_exporting()`` with True under ``torch.compile`` too (pytorch#176347; 2.13 reads
the export flag), so code that asks torch whether it is exported takes the export branch there (the
opaque ``inline_forward``) in every compiled graph. One case goes through the dispatch a layer takes
(``inline_tokens`` with no ``impl``: the fused kernels on CUDA tensors) to ``inline_core``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# name: ((B, H, W, heads, head_dim, prefix), dtype, residual, core kernels (triton.core_kernels))
CASES = {
    "resident": ((4, 6, 5, 3, 32, 1), "bfloat16", True, "resident"),  # DeiT's layer in miniature, resident
    "stream": ((4, 6, 5, 3, 32, 1), "bfloat16", True, "stream"),  # the same under the streaming kernels
    "split": ((1, 32, 32, 2, 32, 0), "bfloat16", False, "resident"),  # few pairs, many tokens: two launches a direction
    "fused": ((2, 4, 4, 2, 64, 0), "float32", True, "stream"),  # fp32 at head dim 64: no streaming tile, fused
}
# the default case through the dispatch, without its residual: the taps a layer predicts are a
# transposed view, and copying fake CUDA tensors needs a CUDA build of torch
DISPATCH_CASE = ((4, 6, 5, 3, 32, 1), "bfloat16", False, "resident")


def _trace(case, via_dispatch: bool = False) -> list[dict]:
    """Compile the core's forward (through ``inline_core``) and backward on fake CUDA tensors, or
    (``via_dispatch``) the forward of ``inline_tokens`` as a layer calls it; every call node of the
    graphs: its target and, for a Triton launch, the kernel and the cloned tensors."""
    import torch
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    from torch._subclasses.fake_tensor import FakeTensorMode

    from inline_attn.ops import inline_tokens
    from inline_attn.ops.fused import op
    from inline_attn.ops.fused import triton as triton_core

    (b, h, w, heads, d, p), dtype, residual, kernels = case
    n, c = p + h * w, heads * d
    nodes: list[dict] = []

    def keep(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            row = {"target": str(node.target)}
            if "triton_kernel_wrapper" in row["target"]:
                row["kernel"] = kernel_side_table.get_kernel(node.kwargs["kernel_idx"]).fn.__name__
                row["cloned"] = sorted(node.kwargs["tensors_to_clone"])
            nodes.append(row)
        return make_boxed_func(gm.forward)

    def core(qkv, taps):
        q, k, v = qkv.chunk(3, dim=-1)
        out = op.inline_core(q, k, v, taps, heads, d**-0.5, h, w, p, "triton")
        return torch.ops.inline_attn.kernels_backward(q, k, v, taps, out, heads, d**-0.5, h, w, p)

    def layer(qkv, taps):  # the dispatch's route; no residual: see DISPATCH_CASE
        q, k, v = qkv.chunk(3, dim=-1)
        return inline_tokens(q, k, v, num_heads=heads, feat_size=(h, w), num_prefix_tokens=p)

    with FakeTensorMode() as mode:
        qkv = torch.empty(b, n, 3 * c, device="cuda:0", dtype=getattr(torch, dtype))
        taps = torch.empty(b, 9, c, device="cuda:0") if residual else None
    compiled = torch.compile(layer if via_dispatch else core, backend=aot_autograd(fw_compiler=keep), fullgraph=True)
    with mode, triton_core.core_kernels(kernels):
        compiled(qkv, taps)
    torch._dynamo.reset()
    return nodes


@contextlib.contextmanager
def dynamo_of_torch_2_11():
    """Inside the block ``torch.compiler.is_exporting()`` reads as torch 2.11's Dynamo reads it:
    True while Dynamo traces (a function it folds to True stands in), False when Python calls it."""
    import torch

    def folded() -> bool:
        return torch.compiler.is_dynamo_compiling()

    def asks_torch(x):
        return x + 1 if torch.compiler.is_exporting() else x

    # Dynamo binds its tracing-state handlers to the functions torch has when it first traces one:
    # a stand-in put there before would be taken for torch's own (and read torch's flag)
    torch.compile(asks_torch, backend="eager", fullgraph=True)(torch.zeros(1))
    torch._dynamo.reset()
    real, torch.compiler.is_exporting = torch.compiler.is_exporting, folded
    try:
        folds = torch.compile(asks_torch, backend="eager", fullgraph=True)(torch.zeros(1)).item() == 1
        torch._dynamo.reset()
        assert folds, "the stand-in for torch 2.11's is_exporting() does not read True under torch.compile"
        yield
    finally:
        torch.compiler.is_exporting = real


def main(out: str) -> None:
    """Trace every case for sm_90 (an H100's limits) and write the graphs' nodes to ``out`` (JSON)."""
    from tools.kernel_audit import TARGETS, Compiler, compiling_for

    from inline_attn.ops.fused import triton as triton_core

    sm90 = next(t for t in TARGETS if t.capability == 90)
    triton_core._cuda_limits = lambda index: triton_core.DeviceLimits("H100 (sm_90, simulated)", 132, 232_448)
    compiler = Compiler()  # shared memory from the compiled kernels, cached with the resources audit's
    triton_core._state["shared_bytes"] = compiler.shared_bytes
    fits = triton_core._unfit_reason

    def unfit_reason(limits, heads, d, dtype, shared_bytes=None):
        # the dispatch's fit check, through the same cache; its simulated device then lets go of it
        try:
            return fits(limits, heads, d, dtype, compiler.shared_bytes)
        finally:
            triton_core._state["shared_bytes"] = compiler.shared_bytes

    triton_core._unfit_reason = unfit_reason
    with compiling_for(sm90), dynamo_of_torch_2_11():
        result = {name: _trace(case) for name, case in CASES.items()}
        result["dispatch"] = _trace(DISPATCH_CASE, via_dispatch=True)
    compiler.save()
    pathlib.Path(out).write_text(json.dumps(result))


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    pytest.importorskip("triton")
    out = tmp_path_factory.mktemp("compiled") / "graphs.json"
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]))
    proc = subprocess.run(
        [sys.executable, __file__, str(out)], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "assuming every input is mutated" not in proc.stderr, proc.stderr[-4000:]
    return json.loads(out.read_text())


def _launches(nodes):
    return [(n["kernel"], n["cloned"]) for n in nodes if "kernel" in n]


OUTPUTS_BWD = ["DK", "DQ", "DV", "DW"]


def test_the_compiled_core_launches_the_resident_kernels_and_clones_only_outputs(graphs):
    assert _launches(graphs["resident"]) == [
        ("inline_fwd_resident_flat", ["O"]),
        ("inline_bwd_resident_flat", OUTPUTS_BWD),
    ]


def test_the_streaming_kernels_are_traced_where_chosen(graphs):
    assert _launches(graphs["stream"]) == [("inline_fwd_stream_flat", ["O"]), ("inline_bwd_stream_flat", OUTPUTS_BWD)]


def test_the_split_launch_is_traced_as_its_four_kernels(graphs):
    assert _launches(graphs["split"]) == [
        ("inline_fwd_partial_flat", ["WS"]),
        ("inline_fwd_rows_flat", ["O"]),
        ("inline_bwd_partial_flat", ["WS"]),
        ("inline_bwd_rows_flat", ["DK", "DQ", "DV"]),  # no residual: DW is DQ (a placeholder), WS only read
    ]


def test_fp32_head_dim_64_is_traced_as_the_fused_kernels(graphs):
    assert _launches(graphs["fused"]) == [("inline_fwd_fused_flat", ["O"]), ("inline_bwd_fused_flat", OUTPUTS_BWD)]


def test_a_layer_on_cuda_tensors_compiles_into_the_kernels(graphs):
    # inline_tokens with no impl on CUDA tensors: the dispatch picks "triton", and the compiled graph
    # launches the default kernel (not the opaque op that export keeps)
    assert _launches(graphs["dispatch"]) == [("inline_fwd_resident_flat", ["O"])]


def test_no_custom_op_is_left_in_the_compiled_graphs(graphs):
    for name, nodes in graphs.items():
        targets = {n["target"] for n in nodes}
        assert not any(t.startswith("inline_attn.") for t in targets), (name, targets)


if __name__ == "__main__":
    main(sys.argv[1])
