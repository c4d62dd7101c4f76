"""A Triton compile cache for the lease, built before it on a machine without a GPU.

On a fresh lease machine every kernel configuration compiles cold the first time it is launched
(LLVM and ptxas: seconds each), inside the check's time boxes. This prebuilds them: the library's
own launchers plan every launch of the lease's benchmarks and profiled model steps on meta tensors
for an H100 / H200 (sm_90, 232,448 bytes of shared memory per block, 132 multiprocessors), and the
Triton of the device compiles each configuration into a cache folder that gpu-check points
``TRITON_CACHE_DIR`` at.

Two processes, because the cache is only valid for the Triton that reads it: Triton's cache key
hashes its own package files (libtriton's binary, which differs per Python version, included), the
kernel's source and line numbers, the bound arguments' specialisation (dtypes, 16-byte alignment,
integers equal to 1 or divisible by 16), the options (warps, stages), ptxas's version and the target
(90 on both GPUs); not the device, the cache's path or torch. The device has Python 3.12 with
triton 3.6.0 (torch 2.11). So:

1. ``python -m tools.gpu_check.triton_cache MANIFEST`` (the project's venv: torch and this tree)
   writes the planned launches as JSON: kernel, arguments (tensors as their dtype) and meta;
2. ``python -m tools.gpu_check.triton_prebuild MANIFEST CACHE`` (a side venv of the device's
   Python with the device's triton alone: no torch) compiles them (:mod:`.triton_prebuild`).

``make gpu-check-cache`` runs both. The launches of the native tests are not planned (hundreds of
small shapes under pytest): they still compile on the device, in the tests' box; the compile step's
graphs too (inductor compiles its own copy of each kernel).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib

import torch

from inline_attn.ops.fused import triton as launchers
from tools.kernel_audit import TARGETS, Compiler, LayerShape, compiling_for, layer_launches, model_layer_shapes

from . import autotune_step, core, goals_step, profile_step, runner

DTYPE = "bfloat16"  # the lease's benchmarks and model steps run under bf16 autocast
SM90 = next(t for t in TARGETS if t.capability == 90)
LIMITS = launchers.DeviceLimits("H100 / H200 (sm_90)", SM90.sms, SM90.shared_per_block)

# (model, image size, batch, overrides): the goals' and the profile's model steps
MODEL_STEPS = (
    ("inline_deit_tiny", 224, goals_step.DEIT_BATCH, {}),
    ("inline_deit_tiny", 1024, 64, {}),
    ("inline_swin_tiny", 224, goals_step.SWIN_BATCH, {"window_size": 7}),
    ("inline_swin_tiny", 224, goals_step.SWIN_BATCH, {"window_size": 56}),
) + tuple((name, profile_step.RESOLUTION, profile_step.BATCH, ov) for _, name, ov in profile_step.MODELS)


def lease_layer_shapes() -> list[LayerShape]:
    """The InLine layers of the lease's model steps and layer benchmarks (bf16), and the host
    part's tiny float32 layer."""
    shapes = []
    for name, size, batch, overrides in MODEL_STEPS:
        if overrides.get("pattern") == "S":
            continue  # the softmax twin: no InLine layer
        shapes += model_layer_shapes(name, size, batch, DTYPE, **overrides)
    for side in (14, 56):  # the layer part: C 96, 3 heads
        shapes.append(LayerShape(goals_step.LAYER_TOKENS // side**2, (side, side), 0, 3, 32, DTYPE))
    shapes.append(LayerShape(1, goals_step.HOST_GRID, 0, 3, 32, "float32"))
    return sorted(set(shapes), key=str)


def _core_launches(shape: core.CoreShape, compiler: Compiler) -> list:
    """The core part's launches at ``shape``: bf16 q, k, v views of one projection, bf16 taps, both
    core kernels (:data:`.core.KERNELS`)."""
    b, n, c = shape.batch, shape.tokens, shape.heads * shape.head_dim
    q = torch.empty(b, n, 3 * c, device="meta", dtype=torch.bfloat16)[..., :c]
    w9 = torch.empty(b, 9, c, device="meta", dtype=torch.bfloat16)
    g = torch.empty(b, n, c, device="meta", dtype=torch.bfloat16)
    args = (shape.heads, shape.head_dim**-0.5, shape.side, shape.side, shape.prefix)
    with compiling_for(SM90), launchers.simulated_device(LIMITS, compiler.shared_bytes):
        with launchers.record_launches() as log:
            for kind in core.KERNELS.values():
                with core.chosen_kernels(kind):
                    launchers.inline_forward_triton(q, q, q, w9, *args)
                    launchers.inline_backward_triton(q, q, q, w9, g, *args)
    return log


def autotune_launches(compiler: Compiler, shapes=autotune_step.SHAPES) -> list:
    """The autotune step's launches: at each of its shapes, the core's forward and backward under
    each of its candidates (:func:`.autotune_step.candidates`) and under the default choice."""
    with compiling_for(SM90), launchers.simulated_device(LIMITS, compiler.shared_bytes):
        with launchers.record_launches() as log:
            for n, d, heads, b in shapes:
                c = heads * d
                q = torch.empty(b, n, 3 * c, device="meta", dtype=autotune_step.DTYPE)[..., :c]
                w9 = torch.empty(b, 9, c, device="meta", dtype=torch.float32)
                g = torch.empty(b, n, c, device="meta", dtype=autotune_step.DTYPE)
                args = (heads, d**-0.5, *autotune_step.shape_args(n))
                for choice in (None, *autotune_step.candidates(n, d, backward=False)):
                    with launchers.forced_core(choice) if choice else contextlib.nullcontext():
                        launchers.inline_forward_triton(q, q, q, w9, *args)
                for choice in (None, *autotune_step.candidates(n, d, backward=True)):
                    with launchers.forced_core(choice) if choice else contextlib.nullcontext():
                        launchers.inline_backward_triton(q, q, q, w9, g, *args)
    return log


def encode(value):
    """A launch argument as JSON: a tensor (or, as :class:`~inline_attn.ops.fused.triton.Launch`
    keeps it, its dtype) as ``{"tensor": dtype}``, a tuple as ``{"tuple": [...]}``."""
    if isinstance(value, torch.Tensor):
        value = value.dtype
    if isinstance(value, torch.dtype):
        return {"tensor": str(value).replace("torch.", "")}
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    return value


def planned_launches(shapes=None, core_shapes=core.CORE_SHAPES, compiler=None, autotune: bool = False) -> list[dict]:
    """Every distinct launch (kernel, encoded arguments, meta) the lease's steps make, planned for
    sm_90; with ``autotune``, the autotune step's candidates too (:func:`autotune_launches`)."""
    compiler = compiler or Compiler()
    shapes = lease_layer_shapes() if shapes is None else shapes
    # the models run the default core kernels; the ncu step profiles both designs at DeiT-T's layer
    logs = [layer_launches(s, SM90, compiler, cores=("resident", "stream")) for s in shapes]
    logs += [_core_launches(s, compiler) for s in core_shapes]
    if autotune:
        logs.append(autotune_launches(compiler))
    seen, out = set(), []
    for launch in (x for log in logs for x in log):
        row = {"kernel": launch.kernel, "args": [encode(a) for a in launch.args], "meta": launch.meta}
        key = json.dumps(row, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(row)
    compiler.save()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="triton_cache", description=__doc__.splitlines()[0])
    parser.add_argument("manifest", type=pathlib.Path, help="where to write the planned launches (JSON)")
    parser.add_argument("check_args", nargs=argparse.REMAINDER, help="gpu-check's arguments (its steps)")
    args = parser.parse_args(argv)
    autotune = "autotune" in runner.parse_args(args.check_args).steps
    launches = planned_launches(autotune=autotune)
    args.manifest.parent.mkdir(parents=True, exist_ok=True)
    args.manifest.write_text(json.dumps({"target": 90, "autotune": autotune, "launches": launches}, indent=0))
    kernels = sorted({x["kernel"] for x in launches})
    with_autotune = ", the autotune step's candidates among them" if autotune else ""
    print(f"{len(launches)} launches of {len(kernels)} kernels planned for sm_90{with_autotune} -> {args.manifest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
