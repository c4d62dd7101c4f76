"""The Triton kernels' resource audit, on a machine without a GPU.

Triton's interpreter, where the kernel tests run, checks neither shared memory nor registers, so a
kernel can pass every test and still fail its first launch on a GPU (``OutOfResources``). This
audit asks the library's own launchers which kernels and configurations they would launch for a
grid of layer shapes and for published models' training steps (run on meta tensors inside
:func:`~inline_attn.ops.fused.triton.simulated_device`: nothing executes), compiles each distinct
configuration for four CUDA targets with the ``ptxas`` that triton's wheel carries, and checks it
against the target's shared memory per block:

==========  =========================  ==================================
target      GPUs                       shared memory per block (opt-in)
==========  =========================  ==================================
sm_80       A100                       163 KB = 166,912 bytes
sm_86       RTX 3090, A6000            99 KB = 101,376 bytes
sm_89       RTX 4090, L40              99 KB = 101,376 bytes
sm_90       H100, H200                 227 KB = 232,448 bytes
==========  =========================  ==================================

Source: NVIDIA, CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"
(maximum amount of shared memory per thread block); an H200 reported 232,448 bytes in its
``OutOfResources`` message. Every target allows 255 registers per thread.

Run it in a process where triton compiles (``TRITON_INTERPRET=0``, which ``make kernel-audit``
sets)::

    TRITON_INTERPRET=0 python -m tools.kernel_audit --full --registers --out audit/

Shared memory is read right after Triton's shared-memory allocation pass (about 0.2 s a
configuration on an idle core); ``--registers`` compiles on through ``ptxas -v`` for registers
and spills (seconds each). Results are cached on disk per kernel source, configuration and target.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from inline_attn.ops.fused import triton as launchers
from inline_attn.runtime.report import markdown_table
from tools import kernel_phases
from tools.files import atomic_write_text


@dataclass(frozen=True)
class Target:
    """A CUDA target: its name, compute capability, GPUs, SM count, shared memory per block, and
    what bounds the programs resident on one multiprocessor: warps, blocks and shared memory."""

    name: str
    capability: int
    gpus: str
    sms: int
    shared_per_block: int
    warps_per_sm: int
    blocks_per_sm: int
    shared_per_sm: int


# CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"
TARGETS = (
    Target("sm_80", 80, "A100", 108, 166_912, 64, 32, 167_936),
    Target("sm_86", 86, "RTX 3090 / A6000", 82, 101_376, 48, 16, 102_400),
    Target("sm_89", 89, "RTX 4090 / L40", 128, 101_376, 48, 24, 102_400),
    Target("sm_90", 90, "H100 / H200", 132, 232_448, 64, 32, 233_472),
)
REGISTERS_PER_THREAD = 255
REGISTERS_PER_SM = 65_536  # every target: allocated per warp in units of 256
SHARED_RESERVED_PER_BLOCK = 1_024  # the driver's share of each resident block's shared memory


def resident_warps(target: Target, registers: int, warps: int, shared: int) -> int:
    """Warps of one kernel resident on a multiprocessor of ``target`` when each program (block) has
    ``warps`` warps of threads using ``registers`` registers and ``shared`` bytes of shared memory."""
    per_warp = -(-registers * 32 // 256) * 256
    blocks = min(
        REGISTERS_PER_SM // (per_warp * warps) if registers else target.blocks_per_sm,
        target.warps_per_sm // warps,
        target.blocks_per_sm,
        target.shared_per_sm // (shared + SHARED_RESERVED_PER_BLOCK),
    )
    return blocks * warps


# the core kernels the audit plans every shape with: the streaming ones, and the resident launch (the
# default) that gpu-check times beside them (the fused and split launches run under both)
AUDITED_CORES = ("stream", "resident")


@dataclass(frozen=True)
class LayerShape:
    """One InLine layer call: ``batch`` samples (or windows) of a ``grid`` of tokens after ``prefix``
    prefix tokens, ``heads`` heads of ``head_dim`` channels; ``residual``: the 3x3 residual;
    ``predictor``: its predictor runs in the kernels too (every layer but CSwin's stripes)."""

    batch: int
    grid: tuple[int, int]
    prefix: int
    heads: int
    head_dim: int
    dtype: str
    residual: bool = True
    predictor: bool = True

    @property
    def tokens(self) -> int:
        return self.prefix + self.grid[0] * self.grid[1]


class _FakeDriver:
    """Triton's active driver for a GPU that is not here: it names the target to compile for."""

    def __init__(self, capability: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", capability, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return self.target.arch  # one compile cache per target

    def get_current_stream(self, device=None):
        return 0


@contextlib.contextmanager
def compiling_for(target: Target):
    """Inside the block, triton compiles for ``target`` (no GPU needed)."""
    from triton.runtime.driver import driver

    previous = driver._active  # None on a machine without a GPU: there is no default driver to restore
    driver.set_active(_FakeDriver(target.capability))
    try:
        yield
    finally:
        driver._active = previous


_PHASES_SOURCE = hashlib.sha256(Path(kernel_phases.__file__).read_bytes()).hexdigest()[:16]
_CACHE_FILE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inline-attn" / "kernel-audit.json"


class Compiler:
    """Compiles kernels for the active target up to what is asked: shared memory (after the
    allocation pass), or on through ptxas for registers and spills. Results are cached in memory
    and in ``cache_file`` (None: memory only)."""

    def __init__(self, registers: bool = False, cache_file: Path | None = _CACHE_FILE):
        self.registers = registers
        self.cache_file = cache_file
        self.cache = self._read_cache()
        self.seen: dict = {}  # (kernel, meta, dtypes, arch) -> result, for the report
        self.new = 0  # compiles not read from the cache

    def _read_cache(self) -> dict:
        try:
            return json.loads(self.cache_file.read_text()) if self.cache_file else {}
        except (OSError, ValueError):
            return {}

    def save(self) -> None:
        """Merge this run's results into the cache file (another run may have added its own)."""
        if self.cache_file is None:
            return
        self.cache = {**self._read_cache(), **self.cache}
        atomic_write_text(self.cache_file, json.dumps(self.cache))

    def shared_bytes(self, kernel, args: tuple, meta: dict) -> int:
        """What :func:`~inline_attn.ops.fused.triton.simulated_device` calls for each candidate."""
        return self.compile(kernel, args, meta)["shared"]

    def compile(self, kernel, args: tuple, meta: dict) -> dict:
        """Compile ``kernel`` for the active target with these arguments and ``meta``, once per
        kernel source, configuration, tensor dtypes and target. Launches that differ only in
        integer arguments (sizes, strides) share the result: Triton specialises those on
        divisibility by 16, which changes how loads are vectorised, not the tiles buffered in
        shared memory (the launchers' fit cache keys alike)."""
        from triton.runtime.driver import driver

        device = driver.active.get_current_device()
        seen_key = (kernel.fn.__name__, tuple(sorted(meta.items())), launchers._dtypes(args), device)
        text = f"{kernel.cache_key}|{seen_key}|{self.registers}"
        if self.registers:  # the barrier structure is kernel_phases' reading: a change there reads it again
            text += f"|{_PHASES_SOURCE}"
        key = hashlib.sha256(text.encode()).hexdigest()
        result = self.cache.get(key)
        if result is None:
            src, backend, options = _source(kernel, device, args, meta)
            result = self.cache[key] = _compile(src, backend, options, device, self.registers)
            self.new += 1
            if self.new % 20 == 0:  # a long sweep keeps what it compiled if it is stopped
                self.save()
        self.seen[seen_key] = result
        return result


def _source(kernel, device, args: tuple, meta: dict):
    """The ASTSource of ``kernel`` specialised as a launch with ``args`` would be (Triton's own binder)."""
    from triton.compiler.compiler import ASTSource

    kwargs = dict(meta, debug=False, instrumentation_mode="")
    _, _, _, backend, binder = kernel.device_caches[device]
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return ASTSource(kernel, signature, constexprs, attrs), backend, options


def _compile(src, backend, options, capability: int, registers: bool) -> dict:
    """Shared memory (bytes) after the allocation pass; with ``registers``, ptxas's registers and
    spills too, and the kernel's barrier structure (:func:`tools.kernel_phases.barrier_structure`,
    or ``phases_error`` where its loops could not be matched)."""
    from triton._C.libtriton import ir, nvidia
    from triton.backends.nvidia.compiler import get_ptx_version_from_options

    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    codegen = backend.get_codegen_implementation(options)
    module = src.make_ir(backend.target, options, codegen, backend.get_module_map(), context)
    metadata: dict = {}
    module = backend.make_ttir(module, metadata, options, capability)
    module = backend.make_ttgir(module, metadata, options, capability)
    if not registers:
        pm = ir.pass_manager(module.context)
        nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(
            pm, capability, get_ptx_version_from_options(options, capability)
        )
        pm.run(module, "allocate_shared_memory")
        return {"shared": module.get_int_attr("ttg.shared")}
    ttgir = str(module)  # before make_llir lowers the module in place
    llir = backend.make_llir(module, metadata, options, capability)
    ptx = backend.make_ptx(llir, metadata, options, capability)
    usage, listing = _ptxas(ptx, capability)
    try:
        if listing is None:
            raise kernel_phases.PhaseError("no nvdisasm beside ptxas in triton's wheel: no SASS to count barriers in")
        paths = kernel_phases.parameter_paths(src.signature)
        phases = {"phases": kernel_phases.barrier_structure(listing, ttgir, paths)}
    except kernel_phases.PhaseError as err:
        phases = {"phases": None, "phases_error": str(err)}
    return {"shared": metadata["shared"], **usage, **phases}


def _ptxas(ptx: str, capability: int) -> tuple[dict, str | None]:
    """Registers per thread and spill bytes (stores + loads) of ``ptx``, from ``ptxas -v``, and the
    SASS listing of the cubin it wrote (``nvdisasm``, beside ptxas in triton's wheel; None without it)."""
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    ptxas = get_ptxas(capability).path
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        cmd = [ptxas, "-v", f"--gpu-name={sm_arch_from_capability(capability)}", str(path)]
        cubin = path.with_suffix(".cubin")
        log = subprocess.run(cmd + ["-o", str(cubin)], capture_output=True, text=True, check=True).stderr
        nvdisasm = Path(ptxas).with_name("nvdisasm")
        listing = None
        if nvdisasm.exists():
            listing = subprocess.run(
                [str(nvdisasm), "-c", str(cubin)], capture_output=True, text=True, check=True
            ).stdout
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    usage = {"registers": int(regs.group(1)) if regs else 0, "spills": sum(map(int, spills.groups())) if spills else 0}
    return usage, listing


def layer_launches(shape: LayerShape, target: Target, compiler: Compiler, cores=AUDITED_CORES) -> list:
    """The launches of one training step (forward and backward) of a layer of ``shape`` on ``target``,
    as the library's launchers plan them (meta tensors; nothing runs), with each of the core kernels
    ``cores`` (:func:`~inline_attn.ops.fused.triton.core_kernels`)."""
    dt = getattr(torch, shape.dtype)
    b, n, c = shape.batch, shape.tokens, shape.heads * shape.head_dim
    q = torch.empty(b, n, 3 * c, device="meta", dtype=dt)[..., :c]  # a view into a qkv projection
    w9 = torch.empty(b, 9, c, device="meta", dtype=torch.float32) if shape.residual else None
    limits = launchers.DeviceLimits(target.gpus, target.sms, target.shared_per_block)
    with compiling_for(target), launchers.simulated_device(limits, compiler.shared_bytes):
        with launchers.record_launches() as log:
            for core in cores:
                with launchers.core_kernels(core):
                    _plan_step(q, w9, shape)
    return log


def _plan_step(q, w9, shape: LayerShape) -> None:
    if shape.predictor or w9 is None:
        launchers.plan_layer_step(q, w9, q.contiguous(), shape.heads, *shape.grid, shape.prefix)
    else:  # CSwin's stripes: the residual's weights come from outside the kernels
        launchers.inline_forward_triton(q, q, q, w9, shape.heads, 1.0, *shape.grid, shape.prefix)
        launchers.inline_backward_triton(q, q, q, w9, q.contiguous(), shape.heads, 1.0, *shape.grid, shape.prefix)


def _captured_shape(mod, args, dtype: str) -> list[LayerShape]:
    """The LayerShapes of one call of an InLine attention module (a TokenAttention on x [B, N, C],
    or a CSwin StripeAttention on q [B, H*W, C] over its regions of windows)."""
    d, heads, res = mod.head_dim, mod.num_heads, mod.residual is not None
    if not hasattr(mod, "_regions"):
        return [LayerShape(args[0].shape[0], tuple(args[1]), mod.num_prefix_tokens, heads, d, dtype, res, res)]
    b = args[0].shape[0]
    out = []
    for _, _, rh, rw, sh, sw in mod._regions(*args[3]):
        out.append(LayerShape(b * (rh // sh) * (rw // sw), (sh, sw), 0, heads, d, dtype, res, False))
    return out


def model_layer_shapes(name: str, img_size: int, batch: int, dtype: str, **overrides) -> list[LayerShape]:
    """The InLine layers one training step of model ``name`` runs at ``img_size`` and ``batch``
    (built and run once per model and size, on meta tensors with its InLine attention modules
    stubbed out: no arithmetic; a layer's samples or windows scale with the batch)."""
    one = _one_image_shapes(name, img_size, tuple(sorted(overrides.items())))
    return [dataclasses.replace(s, batch=s.batch * batch, dtype=dtype) for s in one]


@functools.lru_cache(maxsize=None)
def _one_image_shapes(name: str, img_size: int, overrides: tuple) -> tuple[LayerShape, ...]:
    from inline_attn.models import create_model

    with torch.device("meta"):
        model = create_model(name, img_size=img_size, **dict(overrides))
    shapes: list[LayerShape] = []

    def stub(mod):
        def forward(*args, **kwargs):
            shapes.extend(_captured_shape(mod, args, "float32"))
            return torch.empty_like(args[0])

        return forward

    for mod in model.modules():
        if getattr(mod, "kind", None) == "inline" and hasattr(mod, "residual"):
            mod.forward = stub(mod)
    with torch.no_grad():
        model(torch.empty(1, 3, img_size, img_size, device="meta"))
    return tuple(sorted(set(shapes), key=str))


# (model, image size, overrides): the published models at their sizes, InLine-Swin at Swin's windows
MODEL_CASES = (
    [("inline_deit_tiny", s, {}) for s in (224, 384, 640, 1024)]
    + [(f"inline_deit_{v}", 224, {}) for v in ("small", "base")]
    + [(f"inline_pvt_{v}", 224, {}) for v in ("tiny", "small", "medium", "large")]
    + [(f"inline_swin_{v}", 224, {"window_size": w}) for v in ("tiny", "small", "base") for w in (7, 14, 28, 56)]
    + [("inline_swin_base_384", 384, {})]
    + [(f"inline_cswin_{v}", 224, {}) for v in ("tiny", "small", "base")]
    + [("inline_cswin_base_384", 384, {})]
)
TEST_MODEL_CASES = (("inline_swin_tiny", 224, {"window_size": 7}), ("inline_swin_tiny", 224, {"window_size": 14}))


def layer_grid() -> list[LayerShape]:
    """The layer shapes of the full sweep: batch 1 to 4096, 5 to 12,544 tokens (odd and non-square
    grids, with and without a prefix token), 1 to 32 heads, head dims 16 to 128, three dtypes, with
    and without the residual; shapes over 2^31 elements in a tensor left out (the kernels index in int32)."""
    grids = ((2, 2), (5, 7), (7, 7), (8, 8), (14, 14), (16, 16), (28, 28), (56, 56), (112, 112))
    out = []
    for b in (1, 4, 16, 64, 256, 1024, 4096):
        for grid in grids:
            for prefix, heads, d in (
                (p, h, d) for p in (0, 1) for h in (1, 3, 12, 32) for d in (16, 24, 32, 48, 64, 128)
            ):
                if b * (prefix + grid[0] * grid[1]) * heads * d * 3 >= 2**31:
                    continue
                out += [
                    LayerShape(b, grid, prefix, heads, d, t, r, r)
                    for t in ("float32", "bfloat16", "float16")
                    for r in (True, False)
                ]
    return out


def test_shapes() -> list[LayerShape]:
    """The ``make test`` subset: the shapes that failed on a GPU (issue 33) and the head dims of the
    published models and of custom widths (24, 32, 64, 128), on the resident, fused and split launches."""
    bf16 = "bfloat16"
    return [
        LayerShape(1024, (14, 14), 0, 3, 32, bf16),  # the layer at C 96, 14x14, B 1024
        LayerShape(4096, (7, 7), 0, 6, 32, bf16),  # C 192, 7x7, B 4096
        LayerShape(17, (2, 2), 1, 1, 48, "float32"),  # the predictor test at B 17, N 5, d 48
        LayerShape(1024, (14, 14), 1, 6, 32, bf16),  # InLine-DeiT-T at batch 1024
        LayerShape(64, (14, 14), 0, 4, 24, bf16),  # CSwin-B's head dim
        LayerShape(64, (14, 14), 0, 2, 64, "float32"),  # custom widths, fp32
        LayerShape(1, (56, 56), 0, 3, 32, bf16),  # few pairs, many tokens: the split launch
        LayerShape(16, (14, 14), 0, 2, 128, "float32"),  # over 99 KB at any tile: the eager path there
        LayerShape(128, (14, 14), 1, 6, 32, bf16),  # InLine-DeiT-T at batch 128: the resident launch's largest tile
        LayerShape(64, (8, 16), 0, 2, 64, bf16),  # head dim 64: the resident launch up to 128 tokens
        LayerShape(64, (7, 7), 0, 3, 32, "float32"),  # fp32 windows, resident
    ]


def _shape_launches(shape: LayerShape, target: Target, compiler: Compiler, configs: dict) -> dict | None:
    """Plan ``shape`` on ``target``; add its launches to ``configs`` (keyed per distinct
    configuration, with the first shape that needed it). When the launchers refuse the shape,
    returns the refusal, with ``eager``: whether the dispatch sends such layers to the eager path
    (:func:`~inline_attn.ops.fused.triton.unfit_reason`) so that no user meets the refusal."""
    try:
        log = layer_launches(shape, target, compiler)
    except ValueError as err:
        limits = launchers.DeviceLimits(target.gpus, target.sms, target.shared_per_block)
        with compiling_for(target):
            dtype = getattr(torch, shape.dtype)
            reason = launchers._unfit_reason(limits, shape.heads, shape.head_dim, dtype, compiler.shared_bytes)
        return dict(target=target.name, shape=asdict(shape), error=str(err), eager=reason is not None)
    for launch in log:
        meta = tuple(sorted(launch.meta.items()))
        key = (target.name, launch.kernel, meta, launch.dtypes)
        if key not in configs:
            result = compiler.seen[(launch.kernel, meta, launch.dtypes, target.capability)]
            configs[key] = dict(result, example=asdict(shape))
    return None


def run_audit(shapes, model_cases=(), batches=(1, 16, 64, 256), targets=TARGETS, compiler=None, progress=None) -> dict:
    """The audit: every configuration the launchers choose for ``shapes`` and for the training steps
    of ``model_cases`` at ``batches`` (bf16 autocast and fp32), compiled for ``targets``.

    Returns ``{"configs": [...], "refused": [...], "steps": [...]}``: one row per distinct
    (target, kernel, configuration, dtypes) with its shared memory (and registers / spills), the
    limit and ``ok``; the layer shapes the launchers refused (``eager``: the dispatch runs them on
    the eager path, as it must); one row per model training step.
    """
    compiler = compiler or Compiler()
    configs: dict = {}
    refused, steps = [], []
    for target in targets:
        for shape in shapes:
            why = _shape_launches(shape, target, compiler, configs)
            if why:
                refused.append(why)
            if progress:
                progress()
        for name, size, overrides in model_cases:
            for batch, dtype in ((b, t) for b in batches for t in ("bfloat16", "float32")):
                errors = [
                    _shape_launches(s, target, compiler, configs)
                    for s in model_layer_shapes(name, size, batch, dtype, **overrides)
                ]
                errors = [e for e in errors if e and not e["eager"]]
                steps.append(
                    dict(
                        target=target.name,
                        model=name,
                        img_size=size,
                        batch=batch,
                        dtype=dtype,
                        overrides=overrides,
                        ok=not errors,
                        errors=errors,
                    )
                )
    compiler.save()
    limits = {t.name: t.shared_per_block for t in targets}
    rows = []
    for (target, kernel, meta, dtypes), result in sorted(configs.items(), key=str):
        ok = result["shared"] <= limits[target] and result.get("registers", 0) <= REGISTERS_PER_THREAD
        rows.append(
            dict(
                target=target,
                kernel=kernel,
                meta=dict(meta),
                dtypes=list(dtypes),
                limit=limits[target],
                ok=ok,
                **result,
            )
        )
    return {"configs": rows, "refused": refused, "steps": steps}


# The bf16 layers whose kernels must keep a multiprocessor busy: InLine-DeiT-T's at batch 128,
# Swin-T's first stage at windows of 7 (batch 64: 4,096 windows) and a 14 x 14 map at batch 256;
# the goal: no spills anywhere. Resident warps are reported, not held to a floor: on the H200 the
# streaming kernels' 2- and 4-warp tiles (8 to 20 warps resident) were faster than the 8-warp tiles
# that kept 24 forward and 16 backward (docs/benchmarks.md, "What predicts the kernels' GPU time").
OCCUPANCY_SHAPES = {
    "DeiT-T": LayerShape(128, (14, 14), 1, 6, 32, "bfloat16"),
    "Swin 7x7": LayerShape(64 * 64, (7, 7), 0, 3, 32, "bfloat16"),
    "14x14": LayerShape(256, (14, 14), 0, 3, 32, "bfloat16"),
}
OCCUPANCY_TARGET = "sm_90"


def occupancy(targets=TARGETS, compiler=None) -> list[dict]:
    """One row per (target, shape of OCCUPANCY_SHAPES, kernel the launchers choose), with the
    streaming core kernels on every target and the resident ones (the default design) beside them
    on OCCUPANCY_TARGET, where the barrier model is calibrated (``design``: "stream", "resident",
    or "both" for the predictor's kernels, which the designs share): registers, spilled bytes,
    shared memory, warps per program, resident warps per multiprocessor, ``ok`` (no spills); and
    the barrier model
    (:mod:`tools.kernel_phases`): programs in the grid, resident programs per multiprocessor,
    waves, barriers per program (``barrier_rule``: its formula), phase-waves (barriers x
    ceil(waves)) and ``estimate_us``, phase-waves at the calibration's least and most cost per
    phase-wave (an estimate, not a measurement)."""
    compiler = compiler or Compiler(registers=True)
    rows = []
    for target in targets:
        for label, shape in OCCUPANCY_SHAPES.items():
            planned = set()
            for core in AUDITED_CORES if target.name == OCCUPANCY_TARGET else ("stream",):
                for launch in layer_launches(shape, target, compiler, cores=(core,)):
                    key = (launch.kernel, tuple(sorted(launch.meta.items())), launch.grid, launch.dtypes)
                    if key not in planned:
                        planned.add(key)
                        design = core if launch.kernel.startswith("inline_") else "both"
                        rows.append(_occupancy_row(target, label, design, launch, compiler))
    compiler.save()
    return rows


def _occupancy_row(target: Target, label: str, design: str, launch, compiler: Compiler) -> dict:
    meta = tuple(sorted(launch.meta.items()))
    r = compiler.seen[(launch.kernel, meta, launch.dtypes, target.capability)]
    warps = launch.meta["num_warps"]
    resident = resident_warps(target, r["registers"], warps, r["shared"])
    row = dict(target=target.name, shape=label, design=design, kernel=launch.kernel, warps=warps, **r)
    row.update(resident_warps=resident, ok=r["spills"] == 0)
    programs, per_sm = math.prod(launch.grid), resident // warps
    wave_count = kernel_phases.waves(programs, per_sm, target.sms)
    barriers = kernel_phases.barriers_per_program(r["phases"], launch.args) if r.get("phases") else None
    phase_waves = kernel_phases.phase_waves(barriers, wave_count) if barriers is not None else None
    estimate = [round(phase_waves * us, 1) for us in kernel_phases.PHASE_WAVE_US] if phase_waves is not None else None
    finite = round(wave_count, 2) if math.isfinite(wave_count) else None
    row.update(programs=programs, programs_per_sm=per_sm, waves=finite, barriers=barriers)
    row.update(phase_waves=phase_waves, estimate_us=estimate)
    row.update(barrier_rule=kernel_phases.describe(r["phases"]) if r.get("phases") else None)
    return row


def occupancy_table(rows: list[dict]) -> str:
    columns = ("target", "shape", "design", "kernel", "warps", "registers", "spilled bytes", "shared")
    columns += ("resident warps", "programs", "per SM", "waves", "barriers", "phase-waves", "estimate us")
    cells = []
    for r in rows:
        estimate = "{}-{}".format(*r["estimate_us"]) if r["estimate_us"] else "-"
        cells.append(
            (r["target"], r["shape"], r["design"], r["kernel"], r["warps"], r["registers"], r["spills"])
            + (f"{r['shared']:,}", r["resident_warps"], r["programs"], r["programs_per_sm"])
            + (_or_dash(r["waves"]), _or_dash(r["barriers"]), _or_dash(r["phase_waves"]), estimate)
        )
    return "\n".join(markdown_table(cells, columns))


def _or_dash(value) -> str:
    return "-" if value is None else str(value)


def summary_table(result: dict) -> str:
    """Per target: distinct configurations, those over a limit, refused shapes, failing training
    steps, the largest shared memory and (with --registers) the largest register count and spills."""
    columns = ("target", "configurations", "over a limit", "shapes sent to eager", "refused shapes", "failing steps")
    columns += ("max shared (bytes)", "limit", "max registers", "spilling")
    table = []
    for t in TARGETS:
        configs = [r for r in result["configs"] if r["target"] == t.name]
        if not configs:
            continue
        regs = max((r.get("registers", 0) for r in configs), default=0)
        spilling = sum(1 for r in configs if r.get("spills", 0) > 0)
        refused = sum(1 for r in result["refused"] if r["target"] == t.name and not r["eager"])
        eager = sum(1 for r in result["refused"] if r["target"] == t.name and r["eager"])
        failing = sum(1 for s in result["steps"] if s["target"] == t.name and not s["ok"])
        cells = (f"{t.name} ({t.gpus})", len(configs), sum(not r["ok"] for r in configs), eager, refused, failing)
        cells += (f"{max(r['shared'] for r in configs):,}", f"{t.shared_per_block:,}", regs or "-")
        table.append((*cells, spilling if regs else "-"))
    return "\n".join(markdown_table(table, columns))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.kernel_audit", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--full",
        action="store_true",
        help="the full sweep (every layer shape, every published model); default: the test subset",
    )
    parser.add_argument(
        "--registers", action="store_true", help="compile on through ptxas: registers and spills (slow)"
    )
    parser.add_argument(
        "--occupancy",
        action="store_true",
        help="registers, spills, resident warps, barriers per program, waves and phase-waves of the kernels at "
        "OCCUPANCY_SHAPES (compiles through ptxas, disassembles with nvdisasm)",
    )
    parser.add_argument("--targets", nargs="+", default=[t.name for t in TARGETS], choices=[t.name for t in TARGETS])
    parser.add_argument("--out", type=Path, default=None, help="folder for audit.json and summary.md")
    args = parser.parse_args(argv)
    if launchers.interpreting():
        parser.error("triton runs its interpreter in this process: run with TRITON_INTERPRET=0")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    targets = tuple(t for t in TARGETS if t.name in args.targets)
    if args.occupancy:
        return _report_occupancy(targets, args.out)
    shapes, cases = (layer_grid(), MODEL_CASES) if args.full else (test_shapes(), TEST_MODEL_CASES)
    result = run_audit(
        shapes,
        cases,
        batches=(1, 16, 64, 128, 256) if args.full else (64,),
        targets=targets,
        compiler=Compiler(args.registers),
    )
    table = summary_table(result)
    print(table)
    if args.out is not None:
        atomic_write_text(args.out / "audit.json", json.dumps(result, indent=1, default=str))
        atomic_write_text(args.out / "summary.md", table + "\n")
    bad = any(not r["ok"] for r in result["configs"]) or any(not r["eager"] for r in result["refused"])
    bad = bad or any(not s["ok"] for s in result["steps"])
    return 1 if bad else 0


def _report_occupancy(targets, out: Path | None) -> int:
    rows = occupancy(targets)
    table = occupancy_table(rows)
    print(table)
    if out is not None:
        (out / "occupancy.json").write_text(json.dumps(rows, indent=1))
        (out / "occupancy.md").write_text(table + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
