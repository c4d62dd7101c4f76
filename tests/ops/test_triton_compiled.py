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
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# name: ((B, H, W, heads, head_dim, prefix), dtype, residual, core kernels (triton.core_kernels))
CASES = {
    "resident": ((4, 6, 5, 3, 32, 1), "bfloat16", True, "resident"),  # the default: DeiT's layer in miniature
    "stream": ((4, 6, 5, 3, 32, 1), "bfloat16", True, "stream"),  # the same under the streaming kernels
    "split": ((1, 32, 32, 2, 32, 0), "bfloat16", False, "resident"),  # few pairs, many tokens: two launches a direction
    "fused": ((2, 4, 4, 2, 64, 0), "float32", True, "stream"),  # fp32 at head dim 64: no streaming tile, fused
}


def _trace(case) -> list[dict]:
    """Compile the core's forward (through ``inline_core``) and backward on fake CUDA tensors; every
    call node of the two graphs: its target and, for a Triton launch, the kernel and the cloned tensors."""
    import torch
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    from torch._subclasses.fake_tensor import FakeTensorMode

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

    with FakeTensorMode() as mode:
        qkv = torch.empty(b, n, 3 * c, device="cuda:0", dtype=getattr(torch, dtype))
        taps = torch.empty(b, 9, c, device="cuda:0") if residual else None
    compiled = torch.compile(core, backend=aot_autograd(fw_compiler=keep), fullgraph=True)
    with mode, triton_core.core_kernels(kernels):
        compiled(qkv, taps)
    torch._dynamo.reset()
    return nodes


def main(out: str) -> None:
    """Trace every case for sm_90 (an H100's limits) and write the graphs' nodes to ``out`` (JSON)."""
    from tools.kernel_audit import TARGETS, Compiler, compiling_for

    from inline_attn.ops.fused import triton as triton_core

    sm90 = next(t for t in TARGETS if t.capability == 90)
    triton_core._cuda_limits = lambda index: triton_core.DeviceLimits("H100 (sm_90, simulated)", 132, 232_448)
    compiler = Compiler()  # shared memory from the compiled kernels, cached with the resources audit's
    triton_core._state["shared_bytes"] = compiler.shared_bytes
    with compiling_for(sm90):
        result = {name: _trace(case) for name, case in CASES.items()}
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


def test_the_compiled_core_launches_the_default_kernels_and_clones_only_outputs(graphs):
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


def test_no_custom_op_is_left_in_the_compiled_graphs(graphs):
    for name, nodes in graphs.items():
        targets = {n["target"] for n in nodes}
        assert not any(t.startswith("inline_attn.") for t in targets), (name, targets)


if __name__ == "__main__":
    main(sys.argv[1])
