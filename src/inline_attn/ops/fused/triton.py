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
from pathlib import Path

import torch

_KERNELS_MODULE = "inline_attn.ops.fused.triton_kernels"
_state: dict = {"module": None, "interpret": None, "tiling": None}

# Launch shape (tuned on an H100, docs/benchmarks.md): rows per tile, warps per program (doubled
# for head dims over 32), the number of (sample, head) programs per multiprocessor below which the
# reductions are split over token chunks, and the most row tiles one token-pass program takes.
# Tiles and warps found by gpu-check's autotune step for a (GPU, token bucket, head dim, heads,
# dtype) take precedence (:func:`tiling`), read from TUNING_FILE without re-tuning.
BLOCK_N = int(os.environ.get("INLINE_ATTN_TRITON_BLOCK_N", 64))
NUM_WARPS = int(os.environ.get("INLINE_ATTN_TRITON_WARPS", 2))
TUNING_FILE = Path(__file__).with_name("triton_tuning.json")
_PROGRAMS_PER_SM = int(os.environ.get("INLINE_ATTN_TRITON_PROGRAMS_PER_SM", 8))
ROW_BLOCKS_MAX = 8
_SPLIT_MIN_BLOCKS = 8  # split the reductions only from 8 row tiles (512 tokens) up


def triton_installed() -> bool:
    """True when the ``triton`` package can be imported."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """True when Triton kernels run under the interpreter in this process (CPU tensors)."""
    if _state["module"] is not None:
        return bool(_state["interpret"])
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def load_kernels(device: torch.device):
    """Import :mod:`.triton_kernels` (compiled for CUDA tensors, interpreted for CPU tensors).

    Raises:
        ValueError: triton is not installed, or this process's Triton mode (fixed when triton was
            imported, by ``TRITON_INTERPRET``) does not match the tensors' device.
    """
    if not triton_installed():
        raise ValueError("impl='triton' needs the triton package: pip install 'inline-attn[gpu]'")
    want = device.type != "cuda"
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
        _state["module"] = importlib.import_module(_KERNELS_MODULE)
    return _state["module"]


_launch_logs: list[list[str]] = []


def _launch(kernel, grid: tuple, *args, **meta) -> None:
    """Launch ``kernel`` over ``grid``; every open :func:`record_launches` log gets its name."""
    for log in _launch_logs:
        log.append(kernel.fn.__name__)
    kernel[grid](*args, **meta)


@contextlib.contextmanager
def record_launches():
    """Collect the names of the Triton kernels launched inside the block (a list, in launch order):
    what the launch-budget test counts beside the aten ops."""
    log: list[str] = []
    _launch_logs.append(log)
    try:
        yield log
    finally:
        _launch_logs.remove(log)


def token_bucket(n: int) -> int:
    """Tokens per sample -> the tuning table's bucket: the next power of two (at least 64)."""
    return max(64, triton_next_pow2(n))


def tuning_key(device_name: str, n: int, d: int, heads: int, dtype: torch.dtype) -> str:
    """The tuning table's key of a launch: ``"NVIDIA H100 80GB HBM3|256|32|3|bfloat16"``."""
    return f"{device_name}|{token_bucket(n)}|{d}|{heads}|{str(dtype).replace('torch.', '')}"


@functools.lru_cache(maxsize=None)
def _tuning_table(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        return {}
    table = json.loads(p.read_text()).get("winners", {})
    for key, entry in table.items():
        if not {"BLOCK_N", "num_warps"} <= set(entry) or entry["BLOCK_N"] not in (16, 32, 64, 128):
            raise ValueError(f"{p}: entry {key!r} = {entry} needs BLOCK_N in (16, 32, 64, 128) and num_warps")
    return table


@functools.lru_cache(maxsize=None)
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "interpreter"


def tiling(q: torch.Tensor, n: int, d: int, heads: int) -> tuple[int, int]:
    """(rows per tile, warps per program) of a launch on tensors like ``q``: the tuned winner of
    its (GPU, token bucket, head dim, heads, dtype) when TUNING_FILE has one (head dim 32, the
    paper's Swin / PVT heads, is its own key), else BLOCK_N and NUM_WARPS (doubled over 32)."""
    if _state["tiling"] is not None:
        return _state["tiling"]
    entry = _tuning_table(str(TUNING_FILE)).get(tuning_key(_device_name(q.device), n, d, heads, q.dtype))
    if entry is not None:
        return int(entry["BLOCK_N"]), int(entry["num_warps"])
    return BLOCK_N, NUM_WARPS if _block_d(d) <= 32 else 2 * NUM_WARPS


@contextlib.contextmanager
def forced_tiling(block_n: int, num_warps: int):
    """Every launch inside the block uses this tile and these warps (the autotune sweep's candidates)."""
    if block_n not in (16, 32, 64, 128) or num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"tiling ({block_n}, {num_warps}): BLOCK_N in (16, 32, 64, 128), num_warps a power of 2 <= 16")
    _state["tiling"] = (block_n, num_warps)
    try:
        yield
    finally:
        _state["tiling"] = None


def _block_d(d: int) -> int:
    return max(16, triton_next_pow2(d))


def triton_next_pow2(n: int) -> int:
    return 1 << (max(1, n) - 1).bit_length()


def _precision(dtype: torch.dtype) -> str:
    # float32 inputs get exact fp32 products (as cuBLAS / eager); bf16 / fp16 inputs are exact in
    # tf32, whose only rounding is then on M's entries, below the output's own precision.
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: a few splits, so tests reach the split path at small sizes


def _split(device: torch.device, pairs: int, n: int, block_n: int) -> int:
    """Token chunks per (sample, head): 1 (the fused launch) when the pairs fill the device."""
    target = _PROGRAMS_PER_SM * _num_sms(device)
    if pairs >= target or n < _SPLIT_MIN_BLOCKS * block_n:
        return 1  # enough programs, or too few tokens for the extra launches to pay (14 x 14: 2x slower split)
    blocks = -(-n // block_n)
    return max(1, min(blocks, -(-target // pairs)))


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _out_dtype(q: torch.Tensor) -> torch.dtype:
    # The interpreter's fp32 -> bf16/fp16 store truncates (triton#11584): write fp32, round in torch.
    return torch.float32 if interpreting() and q.dtype != torch.float32 else q.dtype


def _launch_shape(q: torch.Tensor, pairs: int, n: int, split: int | None, block_n: int = BLOCK_N) -> tuple[int, int]:
    """(chunks, chunk length): the reduction's token chunks per (sample, head)."""
    blocks = -(-n // block_n)
    s = _split(q.device, pairs, n, block_n) if split is None else max(1, min(int(split), blocks))
    chunk = -(-blocks // s) * block_n
    return -(-n // chunk), chunk


def _rows_per_program(q: torch.Tensor, pairs: int, n: int, block_n: int = BLOCK_N) -> int:
    """Rows of one token-pass program in the split launch: enough programs to fill the device,
    each loading the finalized d x d matrices once for several row blocks."""
    target = 4 * _PROGRAMS_PER_SM * _num_sms(q.device)
    blocks = -(-n // block_n)
    per = max(1, min(ROW_BLOCKS_MAX, (pairs * blocks) // target))
    return per * block_n


def _meta(q: torch.Tensor, n: int, d: int, heads: int, has_res: bool) -> dict:
    block_n, warps = tiling(q, n, d, heads)
    return dict(D=d, BD=_block_d(d), BLOCK_N=block_n, HAS_RES=has_res, PREC=_precision(q.dtype), num_warps=warps)


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
    default chooses from the device size. Returns [B, N, C] contiguous in q's dtype.
    """
    mod = load_kernels(q.device)
    b, n, c = q.shape
    out = torch.empty((b, n, c), device=q.device, dtype=_out_dtype(q))
    if b == 0 or n == 0:
        return out.to(q.dtype)
    has_res = w9 is not None
    w9_arg = w9.contiguous() if has_res else out  # a placeholder pointer when there is no residual
    pairs = b * num_heads
    meta = _meta(q, n, c // num_heads, num_heads, has_res)
    bd = meta["BD"]
    chunks, chunk = _launch_shape(q, pairs, n, split, meta["BLOCK_N"])
    if chunks == 1:
        _launch(
            mod.inline_fwd_fused,
            (pairs,),
            q,
            k,
            v,
            w9_arg,
            out,
            *_strides(q),
            *_strides(k),
            *_strides(v),
            n,
            c,
            h,
            w,
            p,
            num_heads,
            float(scale),
            **meta,
        )
        return out.to(q.dtype)
    ws = torch.empty((pairs, chunks, bd * bd + 2 * bd), device=q.device, dtype=torch.float32)
    fin = torch.empty((pairs, bd * bd + bd), device=q.device, dtype=torch.float32)
    _launch(
        mod.inline_fwd_partial,
        (pairs, chunks),
        k,
        v,
        ws,
        *_strides(k),
        *_strides(v),
        n,
        num_heads,
        chunk,
        D=meta["D"],
        BD=bd,
        BLOCK_N=meta["BLOCK_N"],
        PREC=meta["PREC"],
        num_warps=meta["num_warps"],
    )
    _launch(
        mod.inline_fwd_finalize,
        (pairs,),
        v,
        ws,
        fin,
        v.stride(0),
        v.stride(2),
        n,
        chunk,
        chunks,
        num_heads,
        float(scale),
        D=meta["D"],
        BD=bd,
        num_warps=meta["num_warps"],
    )
    rows = _rows_per_program(q, pairs, n, meta["BLOCK_N"])
    _launch(
        mod.inline_fwd_rows,
        (pairs, -(-n // rows)),
        q,
        v,
        w9_arg,
        out,
        fin,
        *_strides(q),
        *_strides(v),
        n,
        c,
        h,
        w,
        p,
        num_heads,
        rows,
        **meta,
    )
    return out.to(q.dtype)


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
    dt = _out_dtype(q)
    dq, dk, dv = (torch.empty((b, n, c), device=q.device, dtype=dt) for _ in range(3))
    has_res = w9 is not None
    # every (sample, head) program writes all nine taps of its channels: no fill needed
    dw = torch.empty(
        (b, 9, c) if has_res else (0,),
        device=q.device,
        dtype=torch.float32 if interpreting() or not has_res else w9.dtype,
    )
    if b > 0 and n > 0:
        w9_arg = w9.contiguous() if has_res else dq
        dw_arg = dw if has_res else dq
        pairs = b * num_heads
        meta = _meta(q, n, c // num_heads, num_heads, has_res)
        bd = meta["BD"]
        chunks, chunk = _launch_shape(q, pairs, n, split, meta["BLOCK_N"])
        if chunks == 1:
            _launch(
                mod.inline_bwd_fused,
                (pairs,),
                q,
                k,
                v,
                w9_arg,
                grad,
                dq,
                dk,
                dv,
                dw_arg,
                *_strides(q),
                *_strides(k),
                *_strides(v),
                *_strides(grad),
                n,
                c,
                h,
                w,
                p,
                num_heads,
                float(scale),
                **meta,
            )
        else:
            ws = torch.empty((pairs, chunks, 2 * bd * bd + 19 * bd), device=q.device, dtype=torch.float32)
            fin = torch.empty((pairs, 2 * bd * bd + 3 * bd), device=q.device, dtype=torch.float32)
            _launch(
                mod.inline_bwd_partial,
                (pairs, chunks),
                q,
                k,
                v,
                grad,
                ws,
                *_strides(q),
                *_strides(k),
                *_strides(v),
                *_strides(grad),
                n,
                h,
                w,
                p,
                num_heads,
                chunk,
                **meta,
            )
            _launch(
                mod.inline_bwd_finalize,
                (pairs,),
                k,
                v,
                ws,
                fin,
                dw_arg,
                k.stride(0),
                k.stride(2),
                v.stride(0),
                v.stride(2),
                n,
                c,
                num_heads,
                chunk,
                chunks,
                float(scale),
                D=meta["D"],
                BD=bd,
                HAS_RES=has_res,
                num_warps=meta["num_warps"],
            )
            rows = _rows_per_program(q, pairs, n, meta["BLOCK_N"])
            _launch(
                mod.inline_bwd_rows,
                (pairs, -(-n // rows)),
                k,
                v,
                w9_arg,
                grad,
                dq,
                dk,
                dv,
                fin,
                *_strides(k),
                *_strides(v),
                *_strides(grad),
                n,
                c,
                h,
                w,
                p,
                num_heads,
                float(scale),
                rows,
                **meta,
            )
    dw = dw.to(w9.dtype) if has_res else dw.to(q.dtype)
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype), dw


def _block_b(b: int) -> int:
    """Samples per block of the predictor's backward loop: tl.dot's smallest tile (16) for small
    batches, larger blocks for many samples (Swin's windows: B * 64 per layer) so that each of the
    heads x 10 programs loops fewer times."""
    return 16 if b <= 64 else 32 if b <= 512 else 64


def predictor_forward_triton(
    x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor, num_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual predictor in one launch: x [B, N, C] (any strides), w1 [C, d], b1 [C], w2 [9C, d],
    b2 [9C] (contiguous; one group per head) -> (ctx [B, C], taps [B, 9, C]), both fp32."""
    mod = load_kernels(x.device)
    b, n, c = x.shape
    d = c // num_heads
    ctx = torch.empty((b, c), device=x.device, dtype=torch.float32)
    taps = torch.empty((b, 9, c), device=x.device, dtype=torch.float32)
    if b > 0 and n > 0:
        block_n, warps = tiling(x, n, d, num_heads)
        _launch(
            mod.predictor_fwd,
            (b * num_heads,),
            x,
            w1,
            b1,
            w2,
            b2,
            ctx,
            taps,
            *_strides(x),
            n,
            c,
            num_heads,
            D=d,
            BD=_block_d(d),
            BLOCK_N=block_n,
            num_warps=warps,
        )
    return ctx, taps


def predictor_backward_triton(
    ctx: torch.Tensor,
    dtaps: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor,
    w2: torch.Tensor,
    n: int,
    num_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`predictor_forward_triton` in one launch for the taps' gradient dtaps
    [B, 9, C] (fp32, contiguous): (dctx / N [B, C], dw1, db1, dw2, db2), all fp32."""
    mod = load_kernels(ctx.device)
    b, c = ctx.shape
    d = c // num_heads
    dctx = torch.empty_like(ctx)
    dw1, dw2 = (torch.empty(w.shape, device=ctx.device, dtype=torch.float32) for w in (w1, w2))
    db1 = torch.empty((c,), device=ctx.device, dtype=torch.float32)
    db2 = torch.empty((9 * c,), device=ctx.device, dtype=torch.float32)
    bd = _block_d(d)
    _launch(
        mod.predictor_bwd,
        (num_heads, 10),
        ctx,
        dtaps,
        w1,
        b1,
        w2,
        dctx,
        dw1,
        db1,
        dw2,
        db2,
        b,
        n,
        c,
        D=d,
        BD=bd,
        BLOCK_B=_block_b(b),
        PREC="ieee",
        num_warps=NUM_WARPS if bd <= 32 else 2 * NUM_WARPS,
    )
    return dctx, dw1, db1, dw2, db2
