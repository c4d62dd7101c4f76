"""Launchers for the Triton kernels of the InLine layer core (:mod:`.triton_kernels`).

``triton`` is an optional dependency (``pip install inline-attn[gpu]``); nothing here imports it
until a kernel is launched. On CUDA tensors the kernels are compiled for the GPU. On CPU tensors
they run under Triton's interpreter (``TRITON_INTERPRET=1``, which must be set before the kernels
are first defined: :func:`load_kernels` sets it when the first launch is on the CPU); one process
cannot mix the two modes.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import json
import os
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..compile_marks import constant_when_compiled

from . import launch_cache
from .core_choice import CoreChoice, entry_choices

_KERNEL_MODULES = ("inline_attn.ops.fused.triton_kernels", "inline_attn.ops.fused.triton_stream")
# The core's kernels (:func:`core_kernels`): "auto" (the default: :func:`_auto_design`'s rule per
# launch), "stream" (the streaming programs of .triton_stream), "resident" (the resident launch where
# it fits, else the fused one) or "tiled" (the fused launch); the reduction split over token chunks
# runs the split launch under each. Where the tuning table has an entry for a launch's key its design
# runs instead, unless the core kernels were chosen explicitly (:func:`core_kernels`,
# INLINE_ATTN_TRITON_CORE; ``_state["core_chosen"]``).
CORE_KERNELS = ("auto", "stream", "resident", "tiled")
_CORE_DESIGNS = {"resident": "resident", "stream": "stream", "tiled": "fused"}  # core kernels -> design
# Up to this many tokens a sample the default runs the streaming kernels (:func:`_auto_design`).
AUTO_STREAM_TOKENS = 256
_state: dict = {
    "module": None,
    "interpret": None,
    "forced": None,  # a CoreChoice forced on every core launch (:func:`forced_core`)
    "simulated": None,
    "shared_bytes": None,
    "core": os.environ.get("INLINE_ATTN_TRITON_CORE", "auto"),
    "core_chosen": "INLINE_ATTN_TRITON_CORE" in os.environ,
    "narrow_interpreted": False,
    "flat": False,
    "plans_table": None,  # the tuning table (TUNING_FILE) the plans were made with
}

# Launch shape (tuned on an H100, docs/benchmarks.md): rows per tile, warps per program (doubled
# for head dims over 32), the number of (sample, head) programs per multiprocessor below which the
# reductions are split over token chunks, and the most row tiles one token-pass program takes.
# The designs, tiles and warps found by gpu-check's autotune step for a (GPU, token bucket, head dim,
# heads, dtype) take precedence (:func:`core_choice`), read from TUNING_FILE without re-tuning.
BLOCK_N = int(os.environ.get("INLINE_ATTN_TRITON_BLOCK_N", 64))
NUM_WARPS = int(os.environ.get("INLINE_ATTN_TRITON_WARPS", 2))
TUNING_FILE = Path(__file__).with_name("triton_tuning.json")
_PROGRAMS_PER_SM = int(os.environ.get("INLINE_ATTN_TRITON_PROGRAMS_PER_SM", 8))
ROW_BLOCKS_MAX = 8
_SPLIT_MIN_BLOCKS = 8  # split the reductions only from 8 row tiles (512 tokens) up
# The resident launch (:func:`_resident_config`): one operand's tile of a program holds at most this
# many elements (N up to 256 at head dim 32, 128 at 64), 32 a thread over at most RESIDENT_WARPS warps.
RESIDENT_TILE = 8192
RESIDENT_WARPS = 8


@functools.lru_cache(maxsize=None)
def triton_installed() -> bool:
    """True when the ``triton`` package can be imported (looked up once: a package search costs
    microseconds on every layer call otherwise)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """True when Triton kernels run under the interpreter in this process (CPU tensors)."""
    if _state["module"] is not None:
        return bool(_state["interpret"])
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class DeviceLimits:
    """What a launch must fit on one GPU: its name, its multiprocessor count and the shared memory
    one program (block) may use, in bytes (``shared_memory_per_block_optin``: 232,448 on an H100 /
    H200, 166,912 on an A100, 101,376 on an RTX 3090 / 4090 / L40). ``shared_per_block`` None:
    no limit (Triton's interpreter)."""

    name: str
    sms: int
    shared_per_block: int | None


INTERPRETER = DeviceLimits("interpreter", 4, None)  # 4 SMs: the tests reach the split path at small sizes


@functools.lru_cache(maxsize=None)
def _cuda_limits(index: int) -> DeviceLimits:
    props = torch.cuda.get_device_properties(index)
    return DeviceLimits(props.name, props.multi_processor_count, props.shared_memory_per_block_optin)


def device_limits(device: torch.device) -> DeviceLimits:
    """The limits launches on ``device`` must fit: the GPU's own, the simulated device's (meta
    tensors inside :func:`simulated_device`), or none (the interpreter)."""
    if device.type == "cuda":
        return _cuda_limits(device.index if device.index is not None else torch.cuda.current_device())
    if device.type == "meta" and _state["simulated"] is not None:
        return _state["simulated"]
    return INTERPRETER


@contextlib.contextmanager
def simulated_device(limits: DeviceLimits, shared_bytes):
    """Plan launches for a GPU that is not here (the repository's resources audit, `make kernel-audit`):
    inside the block the launchers take meta tensors as that GPU's, ``shared_bytes(kernel, args, meta)``
    stands in for compiling a configuration (the shared memory it needs), and nothing is launched
    (wrap the block in :func:`record_launches` to see what would be). Triton must not be in
    interpreter mode in this process. Logs opened outside the block do not see its planned
    launches: the dispatch's fit check plans on a simulated device during a real call."""
    _state["simulated"], _state["shared_bytes"] = limits, shared_bytes
    _fit_cache.clear()
    outer_logs = _launch_logs[:]
    _launch_logs.clear()
    try:
        yield
    finally:
        _state["simulated"], _state["shared_bytes"] = None, None
        _fit_cache.clear()
        _launch_logs[:] = outer_logs


def load_kernels(device: torch.device):
    """Import :mod:`.triton_kernels` (compiled for CUDA tensors, interpreted for CPU tensors).

    Raises:
        ValueError: triton is not installed, or this process's Triton mode (fixed when triton was
            imported, by ``TRITON_INTERPRET``) does not match the tensors' device.
    """
    want = device.type != "cuda" and _state["simulated"] is None  # interpreted: CPU tensors, no simulated GPU
    if _state["module"] is not None and _state["interpret"] == want:
        return _state["module"]  # the common case, on every launch: nothing to check again
    if not triton_installed():
        raise ValueError("impl='triton' needs the triton package: pip install 'inline-attn[gpu]'")
    if interpreting() != want:
        if want:
            raise ValueError(
                f"impl='triton' on {device.type} tensors runs under Triton's interpreter, which must be "
                "chosen before triton is imported: set TRITON_INTERPRET=1 in the environment (inline_attn "
                "sets it itself when it is imported before triton on a machine without CUDA)"
            )
        raise ValueError(
            "impl='triton' on CUDA tensors, but this process runs Triton's interpreter (TRITON_INTERPRET=1): "
            "unset it to compile the kernels for the GPU"
        )
    if _state["module"] is None:
        _state["interpret"] = want
        from triton.runtime.jit import KernelInterface

        kernels = {}  # the launchable kernels of both modules (their helpers' names begin with _)
        for name in _KERNEL_MODULES:
            module = importlib.import_module(name)
            kernels.update((k, f) for k, f in vars(module).items() if isinstance(f, KernelInterface) and k[0] != "_")
        _state["module"] = types.SimpleNamespace(**kernels)
    return _state["module"]


_launch_logs: list[list] = []


@dataclass(frozen=True)
class Launch:
    """One kernel launch as :func:`record_launches` logs it: the kernel's name, its grid, its
    compile-time arguments (tiles, warps, pipeline stages), the dtypes of its tensor arguments and
    the arguments with each tensor replaced by its dtype (what a prebuilt compile cache specialises
    on; not compared). No tensor is kept: a log must not hold a step's buffers alive."""

    kernel: str
    grid: tuple
    meta: dict
    dtypes: tuple
    args: tuple = field(default=(), compare=False, repr=False)


def _dtypes(args: tuple) -> tuple:
    return tuple(str(a.dtype).replace("torch.", "") for a in args if isinstance(a, torch.Tensor))


def _launch(kernel, grid: tuple, *args, **meta) -> None:
    """Launch ``kernel`` over ``grid`` (nothing runs for a simulated device; on a GPU through
    :mod:`.launch_cache`; while a graph is traced, as its flat twin through ``wrap_triton``);
    every open :func:`record_launches` log gets the launch."""
    if _launch_logs:
        spec = tuple(a.dtype if isinstance(a, torch.Tensor) else a for a in args)
        for log in _launch_logs:
            log.append(Launch(kernel.fn.__name__, tuple(grid), dict(meta), _dtypes(args), spec))
    if _state["simulated"] is not None:
        return
    if traced(args):  # fake / functional tensors: a graph is being traced
        _traced_launch(kernel, grid, args, meta)
    elif _state["flat"]:
        flat_twin(kernel)[grid](*_flat(args), **meta)
    elif _state["interpret"]:
        kernel[grid](*args, **meta)
    else:
        launch_cache.launch(kernel, grid, args, meta)


# The tensor types that hold data; a traced graph's (fake, functional) are subclasses of torch.Tensor.
_DATA_TENSORS = (torch.Tensor, torch.nn.Parameter)


def traced(args: tuple) -> bool:
    """True when a launch's arguments are a traced graph's (fake or functional tensors: every
    kernel's first argument is a tensor), not tensors with data."""
    return type(args[0]) not in _DATA_TENSORS


def flat_twin(kernel):
    """The kernel of :mod:`.triton_flat` that takes ``kernel``'s arguments with their tuples spelled out.

    Raises:
        ValueError: ``kernel`` has no flat twin (the predictor's kernels: traced graphs run the
            predictor on aten ops).
    """
    from .triton_flat import TWINS

    twin = TWINS.get(kernel.fn.__name__)
    if twin is None:
        raise ValueError(f"{kernel.fn.__name__} has no flat twin in triton_flat.TWINS: it cannot be traced")
    return twin


def _flat(args: tuple) -> tuple:
    """A launch's arguments with each tuple argument spelled out (the flat twins' order)."""
    return tuple(x for a in args for x in (a if isinstance(a, tuple) else (a,)))


def _traced_launch(kernel, grid: tuple, args: tuple, meta: dict) -> None:
    """Record the launch in the traced graph as one ``triton_kernel_wrapper`` node of the flat twin
    (inductor then reads which tensors the kernel writes from its Triton IR, and launches it from
    the compiled graph without this module's Python)."""
    from torch.library import wrap_triton

    wrap_triton(flat_twin(kernel))[tuple(grid)](*_flat(args), **meta)


@contextlib.contextmanager
def flat_launches():
    """Inside the block every launch runs the kernel's flat twin (:mod:`.triton_flat`) directly:
    what the tests compare bit for bit against the kernels themselves."""
    saved, _state["flat"] = _state["flat"], True
    try:
        yield
    finally:
        _state["flat"] = saved


class _PointerArg:
    """A tensor argument as Triton's compiler sees it: its dtype and an aligned address. Stands in
    for a traced graph's tensors (fake, no data) when a configuration is compiled to fit it."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def data_ptr(self) -> int:
        return 0


def _compile_args(args: tuple) -> tuple:
    """``args`` as a configuration is compiled with them: traced tensors replaced by :class:`_PointerArg`."""
    if not traced(args):
        return args
    return tuple(_PointerArg(a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


@contextlib.contextmanager
def record_launches():
    """Collect the Triton launches made inside the block (a list of :class:`Launch`, in launch
    order): what the launch-budget test counts beside the aten ops, and what the resources audit
    compiles."""
    log: list = []
    _launch_logs.append(log)
    try:
        yield log
    finally:
        _launch_logs.remove(log)


_fit_cache: dict = {}


def _candidates(meta: dict) -> list[dict]:
    """The configurations to try for a launch, fastest first: the planned tile with 3, 2 and 1
    software-pipeline stages (each stage buffers the loop's tiles once more in shared memory), then
    at one stage the tile (BLOCK_N) halved down to 16 rows. A halved BLOCK_N still divides every
    chunk and row block of the plan, so the result is unchanged."""
    out = [dict(meta, num_stages=s) for s in (3, 2, 1)]
    size = meta.get("BLOCK_N", 0) // 2  # the resident tile (NP) and the predictor's 16 samples are fixed
    while size >= 16:
        out.append(dict(meta, num_stages=1, BLOCK_N=size))
        size //= 2
    return out


def _compiled_shared_bytes(kernel, args: tuple, meta: dict) -> int:
    """The shared memory ``kernel`` needs with these arguments: compiled (and cached by Triton for
    the launch that follows), not launched."""
    return kernel.warmup(*args, grid=(1,), **meta).metadata.shared


def _fitted_launch(kernel, grid: tuple, args: tuple, meta: dict, what) -> None:
    """Launch ``kernel`` with the first configuration from ``meta`` down that fits the device (:func:`_fit`)."""
    _launch(kernel, grid, *args, **_fit(kernel, args, meta, what))


def _fit(kernel, args: tuple, meta: dict, what) -> dict:
    """The first of :func:`_candidates` whose compiled kernel fits the device's shared memory per
    block (the planned ``meta`` itself under the interpreter, which has no limit); cached per
    kernel, configuration, dtypes and device.

    Raises:
        ValueError: no configuration fits; names the kernel, the shape (``what()``: formatted only
            then, not on every launch) and the device.
    """
    limits = device_limits(args[0].device)  # every kernel's first argument is a tensor
    if limits.shared_per_block is None:
        return meta
    # the key is built on every launch: plain values, no string formatting (host time)
    key = (kernel, *meta.values(), *(a.dtype for a in args if isinstance(a, torch.Tensor)), limits)
    fit = _fit_cache.get(key)
    if fit is None:
        shared_bytes = _state["shared_bytes"] or _compiled_shared_bytes
        compile_args = _compile_args(args)
        needs = []
        for cand in _candidates(meta):
            needs.append(shared_bytes(kernel, compile_args, cand))
            if needs[-1] <= limits.shared_per_block:
                fit = _fit_cache[key] = cand
                break
        else:
            fit = _fit_cache[key] = min(needs)  # a refusal is cached too: not compiled again on every call
    if isinstance(fit, int):
        raise ValueError(
            f"impl='triton': no launch configuration of {kernel.fn.__name__} for {what()} fits {limits.name} "
            f"({limits.shared_per_block} bytes of shared memory per block; the smallest needs {fit}): "
            "use impl='eager' for this layer"
        )
    return fit


# A launcher derives its launch (which kernel, its grid, its fitted compile-time arguments) from
# its arguments' shapes, strides, dtypes and device and from the launch settings alone, so it is
# planned once per such key (:func:`_planned`) and looked up on every later call: a small model's
# GPU step waits on the host, and deriving the launch again cost more than the rest of a launcher.
# At most PLANS_MAX plans are kept, the oldest dropped first: shapes that change on every call
# (a resolution sweep) cannot grow the cache without bound.
PLANS_MAX = 256
_plans: dict = {}


@dataclass(frozen=True)
class _Planned:
    """One launcher call as planned: ``kernel`` (its name in :func:`load_kernels`'s module: a plan
    holds no kernel object, which a test or the host benchmark may have replaced since) over
    ``grid`` with the compile-time arguments ``meta``; or, for the core's reduction split over
    token chunks, ``split``: the plan of its two launches (:class:`_Plan`)."""

    kernel: str | None
    grid: tuple | None
    meta: dict | None
    split: _Plan | None = None


def _planned(key: tuple, build, args: tuple, *inputs):
    """``build(args, *inputs)``, planned once per ``key`` and launch settings (the core kernels of
    :func:`core_kernels` and whether they were chosen, a :func:`forced_core`, the interpreter's
    16-bit shim) and then looked up; ``key`` must hold everything else the plan depends on. A new
    tuning table (TUNING_FILE) drops every plan. Not kept while planning for a simulated device
    (whose shared memory each audit finds its own way) or tracing a graph (symbolic shapes; the
    compiled graph launches without this module)."""
    if _state["simulated"] is not None or traced(args):
        return build(args, *inputs)
    if _state["plans_table"] is not TUNING_FILE:  # an identity test: no hashing of the path
        _plans.clear()
        _state["plans_table"] = TUNING_FILE
    key = (key, _state["core"], _state["core_chosen"], _state["forced"], _state["narrow_interpreted"])
    plan = _plans.get(key)
    if plan is None:
        plan = build(args, *inputs)
        if len(_plans) >= PLANS_MAX:
            del _plans[next(iter(_plans))]
        _plans[key] = plan
    return plan


def token_bucket(n: int) -> int:
    """Tokens per sample -> the tuning table's bucket: the next power of two (at least 64)."""
    return max(64, triton_next_pow2(n))


def tuning_key(device_name: str, n: int, d: int, heads: int, dtype: torch.dtype) -> str:
    """The tuning table's key of a launch: ``"NVIDIA H100 80GB HBM3|256|32|3|bfloat16"``."""
    return f"{device_name}|{token_bucket(n)}|{d}|{heads}|{str(dtype).replace('torch.', '')}"


@functools.lru_cache(maxsize=None)
def _tuning_table(path: str) -> dict:
    """The winners of the tuning table at ``path`` ({} when there is none), every entry checked.

    Raises:
        ValueError: an entry is malformed (:func:`.core_choice.entry_choices`); names the file and key.
    """
    p = Path(path)
    if not p.is_file():
        return {}
    table = json.loads(p.read_text()).get("winners", {})
    for key, entry in table.items():
        entry_choices(entry, f"{p}: entry {key!r}")
    return table


def core_choice(q: torch.Tensor, n: int, d: int, heads: int, backward: bool = False) -> CoreChoice | None:
    """The design and launch parameters chosen for the core's forward (or ``backward``) on tensors
    like ``q`` with ``n`` tokens, ``heads`` heads of ``d`` channels: the :func:`forced_core` one
    inside its block, else the tuning table's winner for its (GPU, token bucket, head dim, heads,
    dtype) when TUNING_FILE has one (head dim 32, the paper's Swin / PVT heads, is its own key),
    else None (the core kernels' rule, :func:`core_kernels`)."""
    if _state["forced"] is not None:
        return _state["forced"]
    key = (str(TUNING_FILE), device_limits(q.device).name, token_bucket(n), d, heads, q.dtype)
    return _tuned_choices(*key)[backward]


@functools.lru_cache(maxsize=None)
def _tuned_choices(path: str, device_name: str, bucket: int, d: int, heads: int, dtype: torch.dtype) -> tuple:
    """(forward, backward) :class:`CoreChoice` from the table at ``path``, (None, None) without an
    entry: looked up once per key (the key's f-string and the lookup cost host time otherwise)."""
    entry = _tuning_table(path).get(tuning_key(device_name, bucket, d, heads, dtype))
    return (None, None) if entry is None else entry_choices(entry)


def tiling(q: torch.Tensor, n: int, d: int, heads: int, backward: bool = False) -> tuple[int, int]:
    """(rows per tile, warps per program) of the fused and split launches on tensors like ``q``:
    the :func:`core_choice`'s when it is the fused design, else BLOCK_N and NUM_WARPS (doubled
    over head dim 32)."""
    return _fused_tile(core_choice(q, n, d, heads, backward), d)


def _fused_tile(choice: CoreChoice | None, d: int) -> tuple[int, int]:
    if choice is not None and choice.design == "fused":
        return choice.block_n, choice.num_warps
    return BLOCK_N, NUM_WARPS if _block_d(d) <= 32 else 2 * NUM_WARPS


@contextlib.contextmanager
def forced_core(choice: CoreChoice):
    """Every core launch inside the block runs ``choice``'s design with its parameters, over the
    tuning table and :func:`core_kernels` (the autotune sweep's candidates), where it fits (the
    resident tile, a streaming tile for the head dim, the device's shared memory), else as the
    core kernels' rule; a forced fused tile also tiles the split launches. The previous choice
    (None outside every block) comes back however the block ends."""
    if not isinstance(choice, CoreChoice):
        raise ValueError(f"forced_core({choice!r}): expected a CoreChoice")
    saved, _state["forced"] = _state["forced"], choice
    try:
        yield
    finally:
        _state["forced"] = saved


def forced_tiling(block_n: int, num_warps: int):
    """:func:`forced_core` of the fused design with this tile and these warps (the fused and split
    launches; the resident and streaming launches are off inside it).

    Raises:
        ValueError: BLOCK_N not in (16, 32, 64, 128) or num_warps not a power of 2 up to 16.
    """
    return forced_core(CoreChoice("fused", num_warps, block_n))


def _block_d(d: int) -> int:
    return max(16, triton_next_pow2(d))


def triton_next_pow2(n: int) -> int:
    return 1 << (max(1, n) - 1).bit_length()


def _precision(dtype: torch.dtype) -> str:
    # float32 inputs get exact fp32 products (as cuBLAS / eager); bf16 / fp16 inputs are exact in
    # tf32, whose rounding then falls on the fp32 operands (M, dM, the centred K and V): 2^-11, below
    # bf16's output precision but at fp16's (the resident and fused kernels' fp16 dQ: up to ~4x eager's
    # error under the interpreter's model of the GPU; the streaming kernels' 16-bit hi + lo operands
    # keep theirs within ~1.3x).
    return "ieee" if dtype == torch.float32 else "tf32"


def _split(device: torch.device, pairs: int, n: int, block_n: int) -> int:
    """Token chunks per (sample, head): 1 (the fused launch) when the pairs fill the device."""
    target = _PROGRAMS_PER_SM * device_limits(device).sms
    if pairs >= target or n < _SPLIT_MIN_BLOCKS * block_n:
        return 1  # enough programs, or too few tokens for the extra launches to pay (14 x 14: 2x slower split)
    blocks = -(-n // block_n)
    return max(1, min(blocks, -(-target // pairs)))


def _strides(*tensors: torch.Tensor) -> tuple[tuple[int, int, int], ...]:
    """The (batch, token, channel) strides of each of ``tensors``, one tuple a tensor: the kernels' stride arguments."""
    return tuple(map(torch.Tensor.stride, tensors))  # 3-d tensors: (batch, token, channel); no Python frame per tensor


def _out_dtype(q: torch.Tensor) -> torch.dtype:
    # The interpreter's fp32 -> bf16/fp16 store truncates (triton#11584): write fp32, round in torch.
    return torch.float32 if _state["interpret"] and q.dtype != torch.float32 else q.dtype  # after load_kernels


def _launch_shape(q: torch.Tensor, pairs: int, n: int, split: int | None, block_n: int = BLOCK_N) -> tuple[int, int]:
    """(chunks, chunk length): the reduction's token chunks per (sample, head)."""
    blocks = -(-n // block_n)
    s = _split(q.device, pairs, n, block_n) if split is None else max(1, min(int(split), blocks))
    chunk = -(-blocks // s) * block_n
    return -(-n // chunk), chunk


def _rows_per_program(q: torch.Tensor, pairs: int, n: int, block_n: int = BLOCK_N) -> int:
    """Rows of one token-pass program in the split launch: enough programs to fill the device,
    each merging its pair's chunk sums once for several row blocks."""
    target = 4 * _PROGRAMS_PER_SM * device_limits(q.device).sms
    blocks = -(-n // block_n)
    per = max(1, min(ROW_BLOCKS_MAX, (pairs * blocks) // target))
    return per * block_n


def _meta(q: torch.Tensor, d: int, tile: tuple[int, int], has_res: bool) -> dict:
    block_n, warps = tile
    return dict(D=d, BD=_block_d(d), BLOCK_N=block_n, HAS_RES=has_res, PREC=_precision(q.dtype), num_warps=warps)


@dataclass(frozen=True)
class _Plan:
    """How one forward or backward of the layer core is launched (host arithmetic only: no
    synchronisation, so a CUDA graph can capture it).

    pairs: (sample, head) programs; meta: the kernels' compile-time arguments (:func:`_meta`);
    chunks, chunk: the reduction's token chunks per pair and their length (1 chunk = the fused
    launch); rows: rows per token-pass program of the split launch; geometry: (N, C, H, W, prefix
    tokens, heads), the token grid: the kernels' ``geo`` argument.
    """

    pairs: int
    meta: dict
    chunks: int
    chunk: int
    rows: int
    geometry: tuple[int, int, int, int, int, int]

    def describe(self) -> str:
        """The shape, for error messages."""
        n, c, h, w, p, heads = self.geometry
        grid = f"{n} tokens ({h}x{w} grid, {p} prefix)"
        return f"{self.pairs // heads} samples of {grid}, {heads} heads of {c // heads} channels"

    @property
    def fused(self) -> bool:
        return self.chunks == 1

    @property
    def rows_grid(self) -> tuple[int, int]:
        """The token pass's grid: (pairs, row blocks of ``rows`` tokens)."""
        return self.pairs, -(-self.geometry[0] // self.rows)

    @property
    def reduce_meta(self) -> dict:
        """The meta-parameters of the split launch's forward partial sums, beside their tile and precision."""
        return dict(D=self.meta["D"], BD=self.meta["BD"], num_warps=self.meta["num_warps"])


@functools.lru_cache(maxsize=None)
def _resident_config(n: int, d: int, has_res: bool, dtype: torch.dtype) -> dict | None:
    """The resident launch's compile-time arguments for N tokens of head dim d (one program per
    (sample, head) holding [NP, BD] tiles, NP >= N a power of two), or None when a tile would
    exceed RESIDENT_TILE elements. Built once per shape (the dict is never mutated: launches copy it)."""
    bd, rows = _block_d(d), max(16, triton_next_pow2(n))
    if rows * bd > RESIDENT_TILE:
        return None
    return dict(D=d, BD=bd, NP=rows, HAS_RES=has_res, PREC=_precision(dtype), num_warps=resident_warps(n, d))


def resident_warps(n: int, d: int) -> int:
    """The resident launch's warps per program for n tokens of head dim d: 32 elements of an [NP, BD]
    tile per thread, 2 to RESIDENT_WARPS (fewer spill registers on sm_90 at its largest tiles)."""
    return max(2, min(RESIDENT_WARPS, max(16, triton_next_pow2(n)) * _block_d(d) // 1024))


def _serial_taps(rows: int, bd: int, dtype: torch.dtype) -> bool:
    """Whether the resident forward's [rows, bd] tiles take the residual's taps one at a time
    (``add_taps``' SERIAL): at the largest 16-bit tiles (8 warps) that compiles to 123
    registers instead of 157 at InLine-DeiT-T's layer on sm_90, two programs a multiprocessor
    instead of one, for six more memory round trips a program; smaller tiles gain fewer programs
    than the round trips they add, and fp32 spills either way. The autotune step times both."""
    return rows * bd == RESIDENT_TILE and dtype in (torch.bfloat16, torch.float16)


def _resident_fit(
    kernel, args: tuple, q: torch.Tensor, heads: int, has_res: bool, params: CoreChoice | None, backward: bool
) -> dict | None:
    """The resident launch's fitted configuration for q [B, N, C] (with ``params``' warps and, forward,
    its taps; None: its own rule's), or None when the shape does not fit its tile or its compiled
    kernel not the device's shared memory (the fp32 backward at N 256 on a 99 KB GPU): the fused /
    split launches run it then."""
    meta = _resident_config(q.shape[1], q.shape[2] // heads, has_res, q.dtype)
    if meta is None:
        return None
    if params is not None:
        meta = dict(meta, num_warps=params.num_warps)
    if not backward:
        serial = None if params is None else params.serial_taps
        meta = dict(meta, SERIAL_TAPS=_serial_taps(meta["NP"], meta["BD"], q.dtype) if serial is None else serial)
    try:
        return _fit(kernel, args, meta, str)
    except ValueError:
        return None


@contextlib.contextmanager
def core_kernels(kind: str):
    """Inside the block the core's one-program-per-(sample, head) launches run ``kind``'s kernels:
    "auto" (the default: per launch by :func:`_auto_design`), "stream" (the streaming programs),
    "resident" (the resident launch where it fits, else the fused one) or "tiled" (the fused
    launch); what the tests and gpu-check's comparison of the designs switch.
    INLINE_ATTN_TRITON_CORE sets it for a whole process.

    Raises:
        ValueError: ``kind`` is not one of CORE_KERNELS.
    """
    if kind not in CORE_KERNELS:
        raise ValueError(f"core kernels {kind!r}: expected one of {CORE_KERNELS}")
    saved = _state["core"], _state["core_chosen"]
    _state["core"], _state["core_chosen"] = kind, True
    try:
        yield
    finally:
        _state["core"], _state["core_chosen"] = saved


# The streaming launch (:func:`_stream_config`): (rows per tile, warps per program) per head-dim
# block, for bf16 / fp16 and fp32 inputs, forward and backward. The 16-bit tiles are the H200's
# autotune winners (docs/gpu-check/h200-2026-11-28-run-d.md): two or four warps a program, though
# ptxas then gives the backward 255 registers and leaves 8 warps resident per multiprocessor; the
# 8-warp tiles that kept 24 warps resident forward and 16 backward (80 and 128 registers) were
# slower there (the backward at InLine-DeiT-T's layer 171 us against 114, Nsight Compute). The
# backward keeps the residual's nine weight-gradient sums per row (nine tiles of registers), so its
# tiles are 16 rows. The fp32 tiles are untimed. Head dims over 64 (32 in fp32) spill in these
# programs: the fused launch runs them. tests/ops/test_kernel_occupancy.py holds every target to no
# spills.
STREAM_TILES = {
    (16, "narrow"): ((16, 2), (16, 2)),
    (32, "narrow"): ((16, 2), (16, 2)),
    (64, "narrow"): ((32, 4), (16, 4)),
    (16, "fp32"): ((32, 8), (16, 8)),
    (32, "fp32"): ((32, 8), (16, 8)),
}


def _stream_config(d: int, has_res: bool, dtype: torch.dtype, backward: bool, tile: CoreChoice | None) -> dict | None:
    """The streaming kernels' compile-time arguments at head dim d (rows per tile and warps from
    ``tile``, None: STREAM_TILES'), or None when the head dim is not in STREAM_TILES. NARROW:
    bf16 / fp16 operands straight into tl.dot (on a GPU, or under the interpreter with the tests'
    shim of its 16-bit products, ``_state["narrow_interpreted"]``)."""
    narrow = dtype != torch.float32 and (not _state["interpret"] or _state["narrow_interpreted"])
    meta = _stream_meta(d, has_res, dtype, narrow, backward)
    if meta is None or tile is None:
        return meta
    return dict(meta, BLOCK_N=tile.block_n, num_warps=tile.num_warps)


@functools.lru_cache(maxsize=None)
def _stream_meta(d: int, has_res: bool, dtype: torch.dtype, narrow: bool, backward: bool) -> dict | None:
    """:func:`_stream_config`, built once per shape (the dict is never mutated: launches copy it)."""
    tiles = STREAM_TILES.get((_block_d(d), "fp32" if dtype == torch.float32 else "narrow"))
    if tiles is None:
        return None
    block_n, warps = tiles[backward]
    prec = _precision(dtype)  # without NARROW, fp32 operands: exact products for fp32 inputs, tf32 for bf16 values
    return dict(D=d, BD=_block_d(d), BLOCK_N=block_n, HAS_RES=has_res, NARROW=narrow, PREC=prec, num_warps=warps)


def design_fits(design: str, n: int, d: int, dtype: torch.dtype) -> bool:
    """Whether ``design`` (:data:`.core_choice.DESIGNS`) has a launch for n tokens of head dim d in
    ``dtype`` (on a GPU): the resident tile (RESIDENT_TILE), a streaming tile (STREAM_TILES); the
    fused design runs every shape. A forced or tuned design that does not fit runs as the core
    kernels' rule instead."""
    if design == "resident":
        return _resident_config(n, d, True, dtype) is not None
    if design == "stream":
        return _stream_meta(d, True, dtype, dtype != torch.float32, False) is not None
    return True


def _plan(
    q: torch.Tensor, num_heads: int, h: int, w: int, p: int, split: int | None, has_res: bool, tile: tuple[int, int]
) -> _Plan:
    """The launch plan for q [B, N, C] (B, N > 0): the fused tile (rows, warps: :func:`tiling`),
    then the chunks (``split`` forces their number, None chooses from the device size)."""
    b, n, c = q.shape
    pairs = b * num_heads
    meta = _meta(q, c // num_heads, tile, has_res)
    chunks, chunk = _launch_shape(q, pairs, n, split, meta["BLOCK_N"])
    rows = _rows_per_program(q, pairs, n, meta["BLOCK_N"])
    return _Plan(pairs, meta, chunks, chunk, rows, (n, c, h, w, p, num_heads))


def _residual_arg(w9: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """The residual's taps as the kernels read them (contiguous), or a placeholder pointer that
    the kernels never read when there is no residual (HAS_RES=False)."""
    return w9.contiguous() if w9 is not None else placeholder


def _workspace(pairs: int, *shape: int, like: torch.Tensor) -> torch.Tensor:
    """An fp32 scratch buffer [pairs, *shape] for the split launch's partial sums (shape from the
    launch plan alone, never from data: capture-safe)."""
    return torch.empty((pairs, *shape), device=like.device, dtype=torch.float32)


def inline_forward_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w9: torch.Tensor | None,
    num_heads: int,
    scale: float,
    h: int,
    w: int,
    p: int,
    split: int | None = None,
) -> torch.Tensor:
    """O = InLine(q, k, v) + R(v, w9): q, k, v [B, N, C] (any strides), w9 [B, 9, C] or None.

    ``split`` forces the number of token chunks of the reduction (1 = the fused launch); the
    default takes the resident launch when a (sample, head) problem fits a program's registers
    (:func:`_resident_config`), else chooses the chunks from the device size. Returns [B, N, C]
    contiguous in q's dtype.
    """
    mod = load_kernels(q.device)
    b, n, c = q.shape
    out = torch.empty((b, n, c), device=q.device, dtype=_out_dtype(q))
    if b > 0 and n > 0:
        w9_arg = _residual_arg(w9, out)
        strides, geometry = _strides(q, k, v), (n, c, h, w, p, num_heads)
        # the resident, streaming and fused kernels take the same arguments
        args = (q, k, v, w9_arg, out, *strides, geometry, float(scale))
        dtypes = (q.dtype, k.dtype, v.dtype, w9_arg.dtype, out.dtype)
        key = ("inline_fwd", b, geometry, strides, dtypes, q.device, w9 is None, split)
        plan = _planned(key, _core_launch, args, mod, _FORWARD_KERNELS, q, split, w9 is not None)
        if plan.split is None:
            _launch(getattr(mod, plan.kernel), plan.grid, *args, **plan.meta)
        else:
            _forward_split(mod, plan.split, q, k, v, w9_arg, out, scale)
    return out if out.dtype == q.dtype else out.to(q.dtype)


@dataclass(frozen=True)
class _CoreKernels:
    """The names of the core's one-program-per-(sample, head) kernels in one direction (they take
    the same arguments)."""

    resident: str
    stream: str
    fused: str
    backward: bool


_FORWARD_KERNELS = _CoreKernels("inline_fwd_resident", "inline_fwd_stream", "inline_fwd_fused", False)
_BACKWARD_KERNELS = _CoreKernels("inline_bwd_resident", "inline_bwd_stream", "inline_bwd_fused", True)


def _core_launch(args: tuple, mod, kernels: _CoreKernels, q, split: int | None, has_res: bool) -> _Planned:
    """How the core's forward or backward runs on ``args`` (q [B, N, C] among them): the design of
    :func:`_core_design` with the chosen parameters (:func:`core_choice`) where they are that
    design's, else the core kernels' rule when they do not fit (:func:`_design_launch`)."""
    n, c, h, w, p, heads = args[-2]
    choice = core_choice(q, n, c // heads, heads, kernels.backward)
    design = _core_design(choice, n, kernels.backward)
    if choice is not None and choice.design == design:
        try:
            return _design_launch(args, mod, kernels, q, split, has_res, design, choice)
        except ValueError:  # no configuration of the chosen tile fits the device's shared memory
            design = _core_design(None, n, kernels.backward)
    try:
        return _design_launch(args, mod, kernels, q, split, has_res, design, None)
    except ValueError:
        if design != "stream":
            raise
        # the streaming tile overflows this device's shared memory: the resident launch (or the fused one)
        return _design_launch(args, mod, kernels, q, split, has_res, "resident", None)


def _design_launch(args: tuple, mod, kernels: _CoreKernels, q, split, has_res: bool, design: str, params) -> _Planned:
    """The core's launch by ``design`` with ``params`` (a :class:`CoreChoice` of that design, or
    None: its own rule's): the resident launch when a (sample, head) problem fits a program's
    registers (:func:`_resident_config`), else the streaming or the fused launch, one program per
    (sample, head), else (too few pairs to fill the device, or ``split`` > 1) the reduction split
    over token chunks.

    Raises:
        ValueError: no configuration of the launch fits the device's shared memory (:func:`_fit`).
    """
    n, c, h, w, p, heads = args[-2]
    d = c // heads
    if split is None and design == "resident":
        resident = _resident_fit(getattr(mod, kernels.resident), args, q, heads, has_res, params, kernels.backward)
        if resident is not None:
            return _Planned(kernels.resident, (q.shape[0] * heads,), resident)
    plan = _plan(q, heads, h, w, p, split, has_res, _fused_tile(params, d))
    if not plan.fused:
        return _Planned(None, None, None, plan)
    stream = _stream_config(d, has_res, q.dtype, kernels.backward, params) if design == "stream" else None
    name, meta = (kernels.stream, stream) if stream is not None else (kernels.fused, plan.meta)
    return _Planned(name, (plan.pairs,), _fit(getattr(mod, name), args, meta, plan.describe))


def _core_design(choice: CoreChoice | None, n: int, backward: bool) -> str:
    """The design a core launch of ``n`` tokens a sample tries first: a forced one; the tuning
    table's (``choice``) unless the core kernels were chosen explicitly; else the core kernels'
    (:func:`core_kernels`; "auto": :func:`_auto_design`)."""
    if choice is not None and (_state["forced"] is not None or not _state["core_chosen"]):
        return choice.design
    if _state["core"] == "auto":
        return _auto_design(n, backward)
    if _state["core"] not in _CORE_DESIGNS:  # only the environment variable sets it unchecked
        raise ValueError(f"INLINE_ATTN_TRITON_CORE={_state['core']!r}: expected one of {CORE_KERNELS}")
    return _CORE_DESIGNS[_state["core"]]


def _auto_design(n: int, backward: bool) -> str:
    """The default core kernels' design for ``n`` tokens a sample, as the H200 timed them
    (docs/gpu-check/h200-2026-11-28-run-d.md, the autotune step over the paper's shapes in bf16):
    the streaming programs up to AUTO_STREAM_TOKENS (1.15-2.4x the resident and fused launches'
    backward at 49 to 197 tokens, 1.06-1.4x their forward from 196 tokens), except the forward of
    at most 64 tokens (Swin's 7x7 windows), where the resident launch was the fastest; beyond, the
    resident launch where its tile fits, else the fused or split one (fused won at 3,136 tokens)."""
    if n > AUTO_STREAM_TOKENS or (n <= 64 and not backward):
        return "resident"
    return "stream"


def _forward_split(mod, plan: _Plan, q, k, v, w9_arg, out, scale: float) -> None:
    """The forward in two launches, for (sample, head) pairs too few to fill the device: each token
    chunk's partial sums (k_bar, v_bar and K^T V of Eq. 5), then the token pass over row blocks,
    each program merging its pair's chunks in chunk order into M and v_bar before
    O = Q M + v_bar + R(V, w)."""
    bd, meta = plan.meta["BD"], plan.meta
    ws = _workspace(plan.pairs, plan.chunks, bd * bd + 2 * bd, like=q)
    partial_args = (k, v, ws, *_strides(k, v), plan.geometry, plan.chunk)
    partial_meta = dict(BLOCK_N=meta["BLOCK_N"], PREC=meta["PREC"], **plan.reduce_meta)
    _fitted_launch(mod.inline_fwd_partial, (plan.pairs, plan.chunks), partial_args, partial_meta, plan.describe)
    rows_args = (
        q,
        v,
        w9_arg,
        out,
        ws,
        *_strides(q, v),
        plan.geometry,
        plan.chunk,
        plan.chunks,
        plan.rows,
        float(scale),
    )
    _fitted_launch(mod.inline_fwd_rows, plan.rows_grid, rows_args, meta, plan.describe)


def inline_backward_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w9: torch.Tensor | None,
    grad: torch.Tensor,
    num_heads: int,
    scale: float,
    h: int,
    w: int,
    p: int,
    split: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv, dw9) of :func:`inline_forward_triton` for the upstream ``grad``.

    dq, dk, dv: [B, N, C] contiguous in q's dtype; dw9: [B, 9, C] in w9's dtype (an empty tensor
    when there is no residual). M is recomputed, not saved.
    """
    mod = load_kernels(q.device)
    b, n, c = q.shape
    has_res = w9 is not None
    dq, dk, dv, dw = _core_gradients(q, w9)
    grads = (dq, dk, dv, dw if has_res else dq)  # dq: a placeholder pointer for dw without a residual
    if b > 0 and n > 0:
        w9_arg = _residual_arg(w9, dq)
        strides, geometry = _strides(q, k, v, grad), (n, c, h, w, p, num_heads)
        # the resident, streaming and fused kernels take the same arguments
        args = (q, k, v, w9_arg, grad, *grads, *strides, geometry, float(scale))
        dtypes = (q.dtype, k.dtype, v.dtype, w9_arg.dtype, grad.dtype, dq.dtype, dw.dtype)
        key = ("inline_bwd", b, geometry, strides, dtypes, q.device, has_res, split)
        plan = _planned(key, _core_launch, args, mod, _BACKWARD_KERNELS, q, split, has_res)
        if plan.split is None:
            _launch(getattr(mod, plan.kernel), plan.grid, *args, **plan.meta)
        else:
            _backward_split(mod, plan.split, q, k, v, w9_arg, grad, grads, scale)
    if has_res and dw.dtype != w9.dtype:
        dw = dw.to(w9.dtype)
    return (*_rounded(q, (dq, dk, dv)), dw)


def _core_gradients(q: torch.Tensor, w9: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """The core backward's outputs for q [B, N, C]: dq, dk, dv [B, N, C] as the kernels write them
    (:func:`_out_dtype`) and dw [B, 9, C] (fp32 under the interpreter, else in w9's dtype; an empty
    tensor without a residual). Every (sample, head) program writes all nine taps of its
    channels: no fill needed."""
    b, n, c = q.shape
    dt = _out_dtype(q)
    dq = torch.empty((b, n, c), device=q.device, dtype=dt)
    dk = torch.empty((b, n, c), device=q.device, dtype=dt)
    dv = torch.empty((b, n, c), device=q.device, dtype=dt)
    if w9 is None:
        return dq, dk, dv, torch.empty((0,), device=q.device, dtype=q.dtype)
    dw_dtype = torch.float32 if interpreting() else w9.dtype
    return dq, dk, dv, torch.empty((b, 9, c), device=q.device, dtype=dw_dtype)


def _rounded(q: torch.Tensor, grads: tuple) -> tuple:
    """``grads`` in q's dtype: the interpreter wrote float32 (triton#11584), rounded here."""
    return grads if grads[0].dtype == q.dtype else tuple(t.to(q.dtype) for t in grads)


def _backward_split(mod, plan: _Plan, q, k, v, w9_arg, grad, grads: tuple, scale: float) -> None:
    """The backward in two launches, for (sample, head) pairs too few to fill the device: each
    token chunk's partial sums (of M's and dM's products, the means and the residual's dw), then
    the token pass (dQ, dK, dV) over row blocks, each program merging its pair's chunks in chunk
    order (the first row block also writes dw9)."""
    dq, dk, dv, dw_arg = grads
    bd, meta = plan.meta["BD"], plan.meta
    ws = _workspace(plan.pairs, plan.chunks, 2 * bd * bd + 19 * bd, like=q)
    partial_args = (q, k, v, grad, ws, *_strides(q, k, v, grad), plan.geometry, plan.chunk)
    _fitted_launch(mod.inline_bwd_partial, (plan.pairs, plan.chunks), partial_args, meta, plan.describe)
    rows_args = (k, v, w9_arg, grad, dq, dk, dv, dw_arg, ws, *_strides(k, v, grad), plan.geometry)
    rows_args += (plan.chunk, plan.chunks, float(scale), plan.rows)
    _fitted_launch(mod.inline_bwd_rows, plan.rows_grid, rows_args, meta, plan.describe)


# The predictor's forward programs take one block of PREDICTOR_BLOCK_B samples each (tl.dot's
# smallest tile: more programs) and read x in tiles of PREDICTOR_TILE_PER_THREAD elements a thread
# (:func:`_predictor_tokens`). Each backward program
# sums its gradient over the blocks of PREDICTOR_BWD_BLOCK_B samples of its chunk in turn, a serial
# chain of about 29 barriers a block (tools/kernel_phases.py); the chunks keep the chains short
# (:func:`_predictor_chunks`), and at 16 samples a block the chunks' kernel compiles without spills
# on sm_80-sm_90 (at 32 it spills on sm_90, whose ptxas holds it to 128 registers).
PREDICTOR_BLOCK_B = 16
PREDICTOR_BWD_BLOCK_B = 16
PREDICTOR_TILE_PER_THREAD = 64


def _predictor_warps(d: int) -> int:
    return 4 if _block_d(d) <= 32 else 8


def _predictor_tokens(d: int, programs: int, sms: int) -> tuple[int, int]:
    """(tokens a tile, warps) of the predictor's forward for head dim ``d`` and ``programs``
    programs on ``sms`` multiprocessors: the [16 samples, tokens, head dim] tile and its fp32 sum
    hold PREDICTOR_TILE_PER_THREAD elements a thread each (no spills on sm_80-sm_90; the loop has as
    many iterations as tiles, each waiting one memory round trip). A grid smaller than the GPU
    leaves multiprocessors idle, so its programs take 8 warps and tiles twice as long (half the
    iterations: InLine-DeiT-T's 48 programs); a grid that fills it keeps 4 at head dim 32, more
    programs resident."""
    warps = 8 if programs < sms else _predictor_warps(d)
    return max(1, PREDICTOR_TILE_PER_THREAD * 32 * warps // (PREDICTOR_BLOCK_B * _block_d(d))), warps


def predictor_forward_triton(
    x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor, num_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual predictor in one launch: x [B, N, C] (any strides), w1 [C, d], b1 [C], w2 [9C, d],
    b2 [9C] (contiguous; one group per head) -> (ctx [B, C], taps [B, 9, C]), both fp32.

    Parallel over (head, block of samples): each program reads its head's weights once for its block.
    """
    mod = load_kernels(x.device)
    b, n, c = x.shape
    ctx, taps = _predictor_outputs(x)
    if b > 0 and n > 0:
        args = (x, w1, b1, w2, b2, ctx, taps, x.stride(), b, n, c)
        key = ("predictor_fwd", x.shape, args[7], x.dtype, w1.dtype, b1.dtype, w2.dtype, b2.dtype, x.device, num_heads)
        plan = _planned(key, _predictor_forward_launch, args, mod, num_heads)
        _launch(mod.predictor_fwd, plan.grid, *args, **plan.meta)
    return ctx, taps


def _predictor_outputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The predictor's outputs for x [B, N, C]: ctx [B, C] and taps [B, 9, C], fp32."""
    b, _, c = x.shape
    ctx = torch.empty((b, c), device=x.device, dtype=torch.float32)
    return ctx, torch.empty((b, 9, c), device=x.device, dtype=torch.float32)


def _predictor_forward_launch(args: tuple, mod, heads: int) -> _Planned:
    """The predictor's forward launch on ``args``: one program per (head, block of samples)."""
    b, n, c = args[-3:]
    d = c // heads
    grid = (heads, -(-b // PREDICTOR_BLOCK_B))
    tokens, warps = _predictor_tokens(d, grid[0] * grid[1], device_limits(args[0].device).sms)
    meta = dict(D=d, BD=_block_d(d), BLOCK_B=PREDICTOR_BLOCK_B, BLOCK_T=tokens, PREC="ieee", num_warps=warps)
    what = functools.partial(_predictor_what, b, n, c, heads)
    return _Planned("predictor_fwd", grid, _fit(mod.predictor_fwd, args, meta, what))


def _predictor_what(b: int, n: int, c: int, heads: int) -> str:
    return f"the residual predictor of {b} samples of {n} tokens, {heads} heads of {c // heads} channels"


def predictor_backward_triton(
    ctx: torch.Tensor,
    dtaps: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor,
    w2: torch.Tensor,
    n: int,
    num_heads: int,
    chunks: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`predictor_forward_triton` for the taps' gradient dtaps [B, 9, C] (fp32,
    contiguous): (dctx / N [B, C], dw1, db1, dw2, db2), all fp32.

    Parallel over (head, slot) for the ten weight gradients of each head (W1 with b1, and W2 with
    b2 per tap) and over chunks of the samples: each program sums its gradient over its chunk in a
    fixed order, and with more than one chunk a second launch adds the chunks' sums in order
    (bit-reproducible, no atomics); slot 0 also takes the samples back through both products for
    dctx. ``chunks`` forces their number (None: :func:`_predictor_chunks`).
    """
    mod = load_kernels(ctx.device)
    b, c = ctx.shape
    grads = _predictor_gradients(ctx, w1, w2)
    # with no samples every program writes zero sums: the gradients need no fill
    args = (ctx, dtaps, w1, b1, w2, *grads, grads[0], b, n, c, _blocks(b))
    key = ("predictor_bwd", ctx.shape, ctx.dtype, dtaps.dtype, w1.dtype, b1.dtype, w2.dtype, ctx.device, num_heads)
    plan = _planned(key + (chunks,), _predictor_backward_launch, args, mod, num_heads, chunks)
    _predictor_backward(mod, plan, args)
    return grads


def _blocks(b: int) -> int:
    """The predictor backward's blocks of PREDICTOR_BWD_BLOCK_B samples among b."""
    return -(-b // PREDICTOR_BWD_BLOCK_B)


def _predictor_backward(mod, plan: _Planned, args: tuple) -> None:
    """The predictor's backward as ``plan`` launches it on ``args`` (ctx, dtaps, w1, b1, w2, the five
    gradients, a workspace placeholder, B, N, C and the sample blocks): one launch, or the chunks'
    sums into a workspace and their merge."""
    *tensors, _, b, n, c, blocks = args
    programs, chunks = plan.grid
    per_chunk = -(-blocks // chunks)
    if chunks == 1:  # the workspace argument is never read: the first gradient stands in
        _launch(mod.predictor_bwd, plan.grid, *tensors, tensors[5], b, n, c, per_chunk, **plan.meta)
        return
    bd = plan.meta["BD"]
    ws = _workspace(chunks, programs, bd * bd + bd, like=tensors[0])
    _launch(mod.predictor_bwd, plan.grid, *tensors, ws, b, n, c, per_chunk, **plan.meta)
    merge = dict(D=plan.meta["D"], BD=bd, num_warps=plan.meta["num_warps"])
    what = functools.partial(_predictor_what, b, n, c, programs // 10)
    _fitted_launch(mod.predictor_bwd_merge, (programs,), (ws, *tensors[6:], chunks), merge, what)


def _predictor_gradients(ctx: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The predictor backward's outputs (dctx, dw1, db1, dw2, db2), fp32, the weights' in their shapes."""
    c = ctx.shape[1]
    f32 = torch.float32
    return (
        torch.empty_like(ctx),
        torch.empty(w1.shape, device=ctx.device, dtype=f32),
        torch.empty((c,), device=ctx.device, dtype=f32),
        torch.empty(w2.shape, device=ctx.device, dtype=f32),
        torch.empty((9 * c,), device=ctx.device, dtype=f32),
    )


# Each program of the predictor's backward sums over a serial chain of sample blocks, about 29
# barriers a block (tools/kernel_phases.py), and a head has only ten programs: from
# PREDICTOR_SPLIT_MIN_BLOCKS blocks on, the samples are split into chunks over a second grid
# dimension, as many as fill the device, and a second launch adds the chunks' sums in order.
PREDICTOR_SPLIT_MIN_BLOCKS = 4


def _predictor_chunks(device: torch.device, programs: int, blocks: int) -> int:
    """Sample chunks of the predictor's backward for ``programs`` (head, slot) programs over
    ``blocks`` sample blocks: 1 below PREDICTOR_SPLIT_MIN_BLOCKS blocks, else enough to fill the
    device (_PROGRAMS_PER_SM a multiprocessor), at most one a block."""
    if blocks < PREDICTOR_SPLIT_MIN_BLOCKS:
        return 1
    return max(1, min(blocks, _PROGRAMS_PER_SM * device_limits(device).sms // programs))


def _predictor_backward_launch(args: tuple, mod, heads: int, chunks: int | None) -> _Planned:
    """The predictor's backward launch on ``args``: programs (head * 10 + weight gradient, chunk
    of samples), ``chunks`` of them (None: :func:`_predictor_chunks`); chunks that would hold no
    block are not launched."""
    b, n, c, blocks = args[-4:]
    d = c // heads
    wanted = _predictor_chunks(args[0].device, heads * 10, blocks) if chunks is None else max(1, min(chunks, blocks))
    chunks = -(-blocks // -(-blocks // wanted)) if blocks else 1
    meta = dict(
        D=d,
        BD=_block_d(d),
        BLOCK_B=PREDICTOR_BWD_BLOCK_B,
        PARTIAL=chunks > 1,
        PREC="ieee",
        num_warps=_predictor_warps(d),
    )
    what = functools.partial(_predictor_what, b, n, c, heads)
    return _Planned("predictor_bwd", (heads * 10, chunks), _fit(mod.predictor_bwd, args, meta, what))


# One InLine layer step on the Triton kernels (the layer core's autograd.Function, ops/fused/op.py):
# the predictor's and the core's launches of each direction planned together, under one key of
# that direction's arguments. A small model's eager GPU step waits on this host path, so it is
# written out flat: one lookup, the output buffers and two launches each way. A direction that
# does not run as two single launches (the core's reductions split over token chunks, the
# predictor's backward over sample chunks, no samples or no tokens) goes through the launchers above.


@dataclass(frozen=True)
class _LayerPlan:
    """The planned launches of one direction of a layer step: the predictor's and the core's,
    each a single launch; both None when the direction goes through the launchers."""

    predictor: _Planned | None
    core: _Planned | None


def layer_forward_triton(x, q, k, v, w1, b1, w2, b2, num_heads: int, scale: float, h: int, w: int, p: int):
    """The layer core's forward: (ctx, taps) = :func:`predictor_forward_triton` (x, w1, b1, w2, b2),
    then O = :func:`inline_forward_triton` (q, k, v, taps) -> (O, ctx, taps).

    x, q, k, v: [B, N, C] (any strides); w1, b1, w2, b2: fp32, contiguous (one group per head).
    Eager tensors (the layer core's autograd.Function; traced graphs take the launchers)."""
    b, n, c = q.shape
    strides, geometry = (x.stride(), q.stride(), k.stride(), v.stride()), (n, c, h, w, p, num_heads)
    dtypes = (x.dtype, q.dtype, k.dtype, v.dtype, w1.dtype, b1.dtype, w2.dtype, b2.dtype)
    key = ("layer_fwd", b, geometry, strides, dtypes, q.device)
    plan = _planned(key, _layer_forward_plan, (x, q, k, v, w1, b1, w2, b2), geometry)
    if plan.core is None:
        ctx, taps = predictor_forward_triton(x, w1, b1, w2, b2, num_heads)
        return inline_forward_triton(q, k, v, taps, num_heads, scale, h, w, p), ctx, taps
    mod, device, f32 = _state["module"], q.device, torch.float32  # the module: loaded by the plan
    ctx, taps = torch.empty((b, c), device=device, dtype=f32), torch.empty((b, 9, c), device=device, dtype=f32)
    predictor, core = plan.predictor, plan.core
    _launch(mod.predictor_fwd, predictor.grid, x, w1, b1, w2, b2, ctx, taps, strides[0], b, n, c, **predictor.meta)
    out = torch.empty((b, n, c), device=device, dtype=_out_dtype(q))
    _launch(getattr(mod, core.kernel), core.grid, q, k, v, taps, out, *strides[1:], geometry, float(scale), **core.meta)
    return (out if out.dtype == q.dtype else out.to(q.dtype)), ctx, taps


def _layer_forward_plan(params: tuple, geometry: tuple) -> _LayerPlan:
    """The forward's two launches on (x, q, k, v, w1, b1, w2, b2), planned (and fitted) on
    buffers like the ones each call allocates."""
    x, q, k, v, w1, b1, w2, b2 = params
    mod = load_kernels(q.device)
    b, n, c = q.shape
    if b == 0 or n == 0:
        return _LayerPlan(None, None)
    ctx, taps = _predictor_outputs(x)
    predictor = _predictor_forward_launch((x, w1, b1, w2, b2, ctx, taps, x.stride(), b, n, c), mod, geometry[-1])
    out = torch.empty((b, n, c), device=q.device, dtype=_out_dtype(q))
    core = _core_launch((q, k, v, taps, out, *_strides(q, k, v), geometry, 1.0), mod, _FORWARD_KERNELS, q, None, True)
    return _LayerPlan(predictor, core) if core.split is None else _LayerPlan(None, None)


def layer_backward_triton(q, k, v, ctx, taps, w1, b1, w2, grad, num_heads: int, scale: float, h: int, w: int, p: int):
    """Gradients of :func:`layer_forward_triton` for the upstream ``grad`` [B, N, C]: the core's
    (:func:`inline_backward_triton`), then the predictor's for the taps' gradient
    (:func:`predictor_backward_triton`) -> (dq, dk, dv, dctx / N [B, 1, C], dw1, db1, dw2, db2)
    (dctx ready to broadcast over the tokens); ctx, taps as the forward returned them. Eager
    tensors only, as the forward."""
    b, n, c = q.shape
    strides, geometry = (q.stride(), k.stride(), v.stride(), grad.stride()), (n, c, h, w, p, num_heads)
    key = ("layer_bwd", b, geometry, strides, (q.dtype, k.dtype, v.dtype, grad.dtype), q.device)
    plan = _planned(key, _layer_backward_plan, (q, k, v, ctx, taps, w1, b1, w2, grad), geometry)
    if plan.core is None:
        dq, dk, dv, dtaps = inline_backward_triton(q, k, v, taps, grad, num_heads, scale, h, w, p)
        dctx, *grads = predictor_backward_triton(ctx, dtaps, w1, b1, w2, n, num_heads)
        return dq, dk, dv, dctx.unsqueeze(1), *grads
    mod, device, dt, f32 = _state["module"], q.device, _out_dtype(q), torch.float32
    dq = torch.empty((b, n, c), device=device, dtype=dt)
    dk = torch.empty((b, n, c), device=device, dtype=dt)
    dv = torch.empty((b, n, c), device=device, dtype=dt)
    dtaps = torch.empty((b, 9, c), device=device, dtype=f32)  # the taps' gradient, fp32 as the taps
    predictor, core = plan.predictor, plan.core
    core_args = (q, k, v, taps, grad, dq, dk, dv, dtaps, *strides, geometry, float(scale))
    _launch(getattr(mod, core.kernel), core.grid, *core_args, **core.meta)
    # the predictor's gradients (as _predictor_gradients), dctx as [B, 1, C]: the kernel writes its
    # B x C values alike, and the layer broadcasts it over the tokens without a reshape
    dctx = torch.empty((b, 1, c), device=device, dtype=f32)
    dw1, dw2 = torch.empty(w1.shape, device=device, dtype=f32), torch.empty(w2.shape, device=device, dtype=f32)
    db1, db2 = torch.empty((c,), device=device, dtype=f32), torch.empty((9 * c,), device=device, dtype=f32)
    blocks = -(-b // PREDICTOR_BWD_BLOCK_B)  # one chunk of every block (written out: no call on this path)
    pred_args = (ctx, dtaps, w1, b1, w2, dctx, dw1, db1, dw2, db2, dctx, b, n, c, blocks)
    _launch(mod.predictor_bwd, predictor.grid, *pred_args, **predictor.meta)
    if dt != q.dtype:  # the interpreter wrote float32 (triton#11584): round here
        dq, dk, dv = dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype)
    return dq, dk, dv, dctx, dw1, db1, dw2, db2


def _layer_backward_plan(params: tuple, geometry: tuple) -> _LayerPlan:
    """The backward's two launches on (q, k, v, ctx, taps, w1, b1, w2, grad), planned (and
    fitted) on buffers like the ones each call allocates."""
    q, k, v, ctx, taps, w1, b1, w2, grad = params
    mod = load_kernels(q.device)
    b, n, c = q.shape
    if b == 0 or n == 0:
        return _LayerPlan(None, None)
    grads = _core_gradients(q, taps)
    core_args = (q, k, v, taps, grad, *grads, *_strides(q, k, v, grad), geometry, 1.0)
    core = _core_launch(core_args, mod, _BACKWARD_KERNELS, q, None, True)
    pred_grads = _predictor_gradients(ctx, w1, w2)
    predictor = _predictor_backward_launch(
        (ctx, grads[3], w1, b1, w2, *pred_grads, ctx, b, n, c, _blocks(b)), mod, geometry[-1], None
    )
    single = core.split is None and predictor.grid[1] == 1  # else the launchers: two launches or more
    return _LayerPlan(predictor, core) if single else _LayerPlan(None, None)


def plan_layer_step(q, w9, grad, num_heads: int, h: int, w: int, p: int, split: int | None = None) -> None:
    """Run every launcher of one layer training step on tensors like these (the predictor's two
    kernels when there is a residual, the core's forward and backward): inside
    :func:`simulated_device` this plans and fits the launches without running them."""
    b, n, c = q.shape
    d = c // num_heads
    if w9 is not None:
        w1, w2 = (torch.empty(r * c, d, device=q.device) for r in (1, 9))
        b1, b2 = (torch.empty(r * c, device=q.device) for r in (1, 9))
        ctx, _ = predictor_forward_triton(q, w1, b1, w2, b2, num_heads)
        predictor_backward_triton(ctx, w9, w1, b1, w2, n, num_heads)
    inline_forward_triton(q, q, q, w9, num_heads, 1.0, h, w, p, split)
    inline_backward_triton(q, q, q, w9, grad, num_heads, 1.0, h, w, p, split)


@functools.lru_cache(maxsize=None)
def _unfit_reason(limits: DeviceLimits, heads: int, d: int, dtype: torch.dtype, shared_bytes=None) -> str | None:
    """:func:`unfit_reason` for a device's limits (``shared_bytes``: how a configuration's shared
    memory is found, by default by compiling it on this machine's GPU)."""
    c = heads * d
    q = torch.empty(1, 16 * 16, 3 * c, device="meta", dtype=dtype)[..., :c]
    w9 = torch.empty(1, 9, c, device="meta")
    rows = max(16, RESIDENT_TILE // _block_d(d))  # the resident launch's largest tile at this head dim
    q_resident = torch.empty(1, rows, 3 * c, device="meta", dtype=dtype)[..., :c]
    with simulated_device(limits, shared_bytes or _compiled_shared_bytes):
        try:
            plan_layer_step(q_resident, w9, q_resident, heads, 1, rows, 0, None)
            for split in (1, 2):  # the fused launch and the split one
                plan_layer_step(q, w9, q, heads, 16, 16, 0, split)
        except ValueError as err:
            return str(err)
    return None


def unfit_reason(q: torch.Tensor, num_heads: int) -> str | None:
    """Why the Triton kernels cannot run a layer on tensors like q [B, N, C] with ``num_heads`` heads
    on q's GPU (no launch configuration of some kernel fits its shared memory per block), or None
    when they can. Compiles, never launches (safe while tracing or capturing); cached per GPU, head
    shape and dtype. None off CUDA (the interpreter has no limit)."""
    if q.device.type != "cuda":
        return None
    return _cuda_unfit_reason(q.device.index, num_heads, q.shape[-1] // num_heads, q.dtype)


@constant_when_compiled  # under torch.compile: evaluated once while tracing, not traced
def _cuda_unfit_reason(index: int, heads: int, d: int, dtype: torch.dtype) -> str | None:
    """:func:`unfit_reason` on CUDA device ``index``. Plain arguments and no cache wrapper of its
    own: Dynamo unwraps an lru_cache and traces its body, dropping the mark, and the body (meta
    tensors, the fit cache keyed by kernels) breaks the graph."""
    return _unfit_reason(_cuda_limits(index), heads, d, dtype)
