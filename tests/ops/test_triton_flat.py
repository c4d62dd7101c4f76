"""The core kernels' flat twins (``triton_flat``, what ``torch.compile`` launches) compute the same bits.

Every launch of the core's forward and backward, in each launch shape (streaming, resident, fused
and split), runs once through the kernel and once through its twin (``flat_launches``): outputs and
gradients must be bit-equal. Each twin's parameters are its kernel's with every tuple spelled out.
Under Triton's interpreter here; natively on a GPU.
"""

from __future__ import annotations

import inspect
import pathlib

import pytest
import torch

from inline_attn.ops.fused import triton as triton_core

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _flat_params(kernel) -> list[str]:
    """``kernel``'s parameter names with each stride triple ``x_st`` spelled x0, x1, x2 and the grid
    ``geo`` as its six integers (the twins' names)."""
    names = []
    for name in _params(kernel):
        if name.endswith("_st"):
            names += [f"{name[0]}{i}" for i in range(3)]
        elif name == "geo":
            names += ["n", "c", "h", "w", "p", "heads"]
        else:
            names.append(name)
    return names


def _params(kernel) -> list[str]:
    return list(inspect.signature(kernel.fn).parameters)


def _constexprs(kernel) -> list[str]:
    params = inspect.signature(kernel.fn).parameters.values()
    return [p.name for p in params if "constexpr" in str(p.annotation)]


def test_every_core_kernel_has_a_twin_taking_its_arguments_spelled_out():
    mod = triton_core.load_kernels(torch.device(DEVICE))
    from inline_attn.ops.fused.triton_flat import TWINS

    core = sorted(name for name in vars(mod) if name.startswith("inline_"))
    assert sorted(TWINS) == core
    for name, twin in TWINS.items():
        kernel = getattr(mod, name)
        assert _params(twin) == _flat_params(kernel), name
        assert _constexprs(twin) == _constexprs(kernel), name


def test_the_predictor_kernels_have_no_twin():
    mod = triton_core.load_kernels(torch.device(DEVICE))
    with pytest.raises(ValueError, match="predictor_fwd has no flat twin"):
        triton_core.flat_twin(mod.predictor_fwd)


def _step(shape, split, residual: bool):
    """One forward and backward of the core through the launchers: (out, dq, dk, dv, dw9) and the kernels."""
    b, h, w, heads, d, p = shape
    n, c = p + h * w, heads * d
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(b, n, 3 * c, generator=gen).to(DEVICE)
    q, k, v = qkv.chunk(3, dim=-1)
    w9 = torch.randn(b, 9, c, generator=gen).to(DEVICE) if residual else None
    g = torch.randn(b, n, c, generator=gen).to(DEVICE)
    with triton_core.record_launches() as log:
        out = triton_core.inline_forward_triton(q, k, v, w9, heads, d**-0.5, h, w, p, split)
        grads = triton_core.inline_backward_triton(q, k, v, w9, g, heads, d**-0.5, h, w, p, split)
    return (out, *grads), [x.kernel for x in log]


# (B, H, W, heads, head_dim, prefix), the core kernels, the forced split (None: the launchers' choice),
# a residual or not, the kernels launched
CASES = [
    ((1, 3, 5, 2, 24, 1), "stream", None, True, ["inline_fwd_stream", "inline_bwd_stream"]),
    ((2, 3, 2, 1, 32, 0), "stream", None, False, ["inline_fwd_stream", "inline_bwd_stream"]),
    ((1, 4, 3, 1, 32, 0), "resident", None, True, ["inline_fwd_resident", "inline_bwd_resident"]),
    ((1, 5, 7, 2, 16, 2), "tiled", 1, True, ["inline_fwd_fused", "inline_bwd_fused"]),
    (
        (1, 9, 15, 1, 16, 0),
        "stream",
        2,
        True,
        ["inline_fwd_partial", "inline_fwd_rows", "inline_bwd_partial", "inline_bwd_rows"],
    ),
]


@pytest.mark.parametrize("shape,kind,split,residual,kernels", CASES, ids=lambda x: str(x))
def test_flat_twins_give_the_kernels_bits(shape, kind, split, residual, kernels):
    with triton_core.core_kernels(kind):
        want, launched = _step(shape, split, residual)
        with triton_core.flat_launches():
            got, launched_flat = _step(shape, split, residual)
    assert launched == launched_flat == kernels
    for a, b in zip(got, want):
        assert torch.equal(a, b)


# Run with the compiler (not the interpreter, whose ``triton.jit`` makes no JITFunction for inductor
# to follow): write each twin out as inductor does for a compiled graph and load that source as a
# module; list every global name a Triton function in it reads that the module does not define; then
# compile the written-out twin of each launch of a layer step (every design, and the split launch)
# for sm_90 with its float argument typed fp64, as inductor types a Python float on a GPU with fp64.
_WRITE_OUT = """
import builtins, dis, importlib.util, pathlib, sys
import triton
from torch._inductor.codegen.wrapper import user_defined_triton_kernel_transitive_closure_source_code as closure
from inline_attn.ops.fused import triton as launchers
from inline_attn.ops.fused.triton_flat import TWINS
from tools import kernel_audit as ka
folder, written = pathlib.Path(sys.argv[1]), {}
for name, twin in TWINS.items():
    path = folder / f"{name}.py"
    path.write_text("import triton\\nimport triton.language as tl\\n@triton.jit\\n" + closure(twin))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = written[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for fn in vars(mod).values():
        if isinstance(fn, triton.JITFunction):
            for ins in dis.Bytecode(fn.fn):
                if ins.opname == "LOAD_GLOBAL" and ins.argval not in vars(mod) and not hasattr(builtins, ins.argval):
                    print(f"{name}: {fn.__name__} reads {ins.argval}")
sm90, compiler = ka.TARGETS[3], ka.Compiler(cache_file=None)
shapes = [ka.LayerShape(2, (7, 7), 1, 2, 32, "bfloat16"), ka.LayerShape(1, (40, 40), 0, 1, 32, "bfloat16")]
cores = [("resident", "stream", "tiled"), ("resident",)]  # the second: few pairs, many tokens (split)
launches = [x for shape, c in zip(shapes, cores) for x in ka.layer_launches(shape, sm90, compiler, cores=c)]
compiled = set()
with ka.compiling_for(sm90):
    for launch in launches:
        if launch.kernel not in TWINS:
            continue
        twin = getattr(written[launch.kernel], launch.kernel + "_flat")
        spec = (launchers._PointerArg(a) if hasattr(a, "is_floating_point") else a for a in launch.args)
        args = launchers._flat(tuple(spec))
        src, backend, options = ka._source(twin, sm90.capability, args, launch.meta)
        if "scale" in src.signature:  # the partial sums' kernels take none
            src.signature["scale"] = "fp64"
        try:
            ka._compile(src, backend, options, sm90.capability, registers=False)
        except Exception as err:
            print(f"{launch.kernel}: {type(err).__name__}: {str(err)[-300:]}")
        compiled.add(launch.kernel)
missing = sorted(set(TWINS) - compiled)
print(f"not compiled: {missing}" if missing else "", end="")
"""


def test_inductor_writes_out_every_twin_with_the_names_it_calls(tmp_path):
    """``torch.compile`` compiles each twin from the source inductor writes out: the kernel and the
    Triton functions it names as globals, its float argument typed fp64. A helper called through a
    module (``tiles.load_row``) is left out, and an fp64 ``scale`` reached ``tl.dot``: the compiled
    models failed on the H200 runs of 2026-11-28 with ``NameError``, then a dtype mismatch."""
    pytest.importorskip("torch._inductor.codegen.wrapper")
    import os
    import subprocess
    import sys

    root = str(pathlib.Path(__file__).resolve().parents[2])
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": os.pathsep.join([root + "/src", root])}
    done = subprocess.run(
        [sys.executable, "-c", _WRITE_OUT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == ""
