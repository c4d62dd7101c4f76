"""Exporting models: ``torch.export`` and ONNX through the dynamo exporter.

The fused InLine layer core is a custom op with a fake implementation (:mod:`inline_attn.ops.fused`),
so ``torch.export.export(model, (x,))`` keeps it as one node, ``inline_attn.inline_forward``, and
the exported program runs it. :func:`export_program` does that export in eval mode with softmax
attention traced in its math form, which the ONNX exporter needs.

ONNX has no such op. :func:`export_onnx` exports with a translation of it written in standard
ONNX operators (:func:`inline_forward_onnx`: the InLine output of paper Eq. 5 per head, in the
reference's scale, plus the 3x3 local residual of Sec. 4.2 as nine shifted multiply-adds), so the
ONNX graph computes what the fused kernel computes and runs on any ONNX runtime, with a dynamic
batch dimension if asked. ``torch.onnx.export(..., custom_translation_table=onnx_translation_table())``
does the same by hand. A plain ``torch.onnx.export(model, ...)`` of a module works too: while it
traces, the one dispatch decision (:func:`inline_attn.ops.dispatch.tracing_reason`) keeps the
layers off the fused op, so the graph is the eager path's standard operators.

Requires ``onnx`` and ``onnxscript`` (``pip install 'inline-attn[export]'``; ``onnxruntime`` to run
the result).
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

import torch
import torch.nn as nn

from ._io import atomic_path, writable_file
from .layers import check_flag

__all__ = ["export_onnx", "export_program", "inline_forward_onnx", "onnx_translation_table"]


def _opset():
    try:
        from onnxscript import opset18
    except ImportError as e:  # an optional dependency
        raise ImportError("ONNX export needs onnxscript and onnx: pip install 'inline-attn[export]'") from e
    return opset18


def inline_forward_onnx(
    q, k, v, w9, num_heads: int, scale: float, H: int, W: int, num_prefix_tokens: int, backend: str
):
    """``inline_attn::inline_forward`` in ONNX operators (opset 18), for the dynamo exporter.

    q, k, v: [B, N, C] with ``N = num_prefix_tokens + H*W`` (static: the op's arguments fix it);
    w9: [B, 9, C] residual taps (tap ``3 * ky + kx`` of a row-major 3x3 kernel) or None;
    ``backend`` names the fused implementation and does not change the result. Returns [B, N, C].

    Per head (paper Eq. 5, the reference's scale): ``O = Q M + v_bar`` with
    ``M = scale / N * (K - k_bar)^T (V - v_bar)`` (both factors centred, as the kernels do);
    then the grid tokens get ``sum_t w9[t] * V(y + ky - 1, x + kx - 1)`` (zero padding).
    """
    op = _opset()
    n = num_prefix_tokens + H * W

    def ints(*values):
        return op.Constant(value_ints=list(values))

    def heads(t):  # [B, N, C] -> [B, h, N, d]
        return op.Transpose(op.Reshape(t, ints(0, 0, num_heads, -1)), perm=[0, 2, 1, 3])

    qh, kh, vh = heads(q), heads(k), heads(v)
    axis_n = ints(2)
    k_bar = op.ReduceMean(kh, axis_n, keepdims=1)  # [B, h, 1, d]
    v_bar = op.ReduceMean(vh, axis_n, keepdims=1)
    kv = op.MatMul(op.Transpose(op.Sub(kh, k_bar), perm=[0, 1, 3, 2]), op.Sub(vh, v_bar))  # [B, h, d, d]
    kv = op.Mul(kv, op.CastLike(op.Constant(value_float=scale / n), kv))
    out = op.Add(op.MatMul(qh, kv), v_bar)  # [B, h, N, d]
    out = op.Reshape(op.Transpose(out, perm=[0, 2, 1, 3]), ints(0, 0, -1))  # [B, N, C]
    if w9 is None:
        return out

    grid = op.Slice(v, ints(num_prefix_tokens), ints(n), ints(1))  # [B, HW, C]
    padded = op.Pad(op.Reshape(grid, ints(0, H, W, -1)), ints(0, 1, 1, 0, 0, 1, 1, 0))  # [B, H+2, W+2, C]
    res = None
    for ky in range(3):
        for kx in range(3):
            window = op.Slice(padded, ints(ky, kx), ints(ky + H, kx + W), ints(1, 2))  # [B, H, W, C]
            tap = op.Unsqueeze(op.Gather(w9, op.Constant(value_int=3 * ky + kx), axis=1), ints(1, 2))  # [B,1,1,C]
            term = op.Mul(window, op.CastLike(tap, window))
            res = term if res is None else op.Add(res, term)
    res = op.Reshape(res, ints(0, H * W, -1))  # [B, HW, C]
    if num_prefix_tokens == 0:
        return op.Add(out, res)
    prefix = op.Slice(out, ints(0), ints(num_prefix_tokens), ints(1))
    tokens = op.Slice(out, ints(num_prefix_tokens), ints(n), ints(1))
    return op.Concat(prefix, op.Add(tokens, res), axis=1)


def onnx_translation_table() -> dict:
    """``custom_translation_table`` for ``torch.onnx.export(..., dynamo=True)``: the fused op."""
    _opset()
    from .ops.fused import op  # noqa: F401  (registers the op)

    return {torch.ops.inline_attn.inline_forward.default: inline_forward_onnx}


def _check_example(example) -> None:
    if not isinstance(example, torch.Tensor) or example.dim() != 4:
        raise ValueError(f"example must be an image batch [B, C, H, W], got {getattr(example, 'shape', example)!r}")
    if not example.is_floating_point():
        raise ValueError(
            f"example of dtype {example.dtype}: export with a floating-point batch as the model takes it "
            "(for 8-bit images x.float() / 255, then the model's normalisation)"
        )
    if min(example.shape) == 0:
        raise ValueError(f"example of shape {tuple(example.shape)}: expected at least one image of at least one pixel")


def export_program(
    model: nn.Module, example: torch.Tensor, *, dynamic_batch: bool = False, **kwargs: Any
) -> torch.export.ExportedProgram:
    """``torch.export.export(model, (example,))`` in eval mode, as :func:`export_onnx` needs it.

    The fused InLine core stays one ``inline_attn.inline_forward`` node. Softmax attention
    (``F.scaled_dot_product_attention``) is traced in its math form: the CPU flash kernel's output
    strides differ from the math decomposition the ONNX exporter replays, and views traced on them
    fail there (:func:`export_onnx` decomposes in the math form too).

    Args:
        model: any module.
        example: an input batch [B, C, H, W]; the program is specialised to its image size.
        dynamic_batch: let the batch dimension vary (1 to 1024); a batch-1 example is traced as two
            copies of itself (``torch.export`` would specialise a dimension of size 1).
        **kwargs: passed to ``torch.export.export`` (``dynamic_shapes``, ``strict``, ...).

    The program takes the example's image size and dtype only: ``program.module()`` refuses another
    size (or channel count, or batch without ``dynamic_batch``, or a batch outside 1 to 1024 with
    it) or another dtype with a ValueError naming what was exported and what was given; export again
    for it. (A program saved and loaded again by
    ``torch.export.save`` / ``load`` has torch's own input guards only.)
    A ``model`` that is not a module and a ``dynamic_batch`` that is not a bool are ValueErrors.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_flag("dynamic_batch", dynamic_batch)
    _check_example(example)
    if "dynamic_shapes" in kwargs and dynamic_batch:
        raise ValueError("give dynamic_batch=True or dynamic_shapes, not both")
    if dynamic_batch:
        kwargs["dynamic_shapes"] = ({0: torch.export.Dim("batch", min=1, max=1024)},)
        if example.shape[0] == 1:
            example = example.repeat(2, 1, 1, 1)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    was_training = model.training
    model.eval()
    try:
        with sdpa_kernel(SDPBackend.MATH):
            program = torch.export.export(model, (example,), **kwargs)
    finally:
        model.train(was_training)
    _refuse_other_sizes(program)
    return program


def _exported_input(program: torch.export.ExportedProgram):
    """The shape of the program's one user input (None where a dimension is dynamic), the range its
    batch may take (an upper bound of None: none) and its dtype."""
    (name,) = program.graph_signature.user_inputs
    (node,) = [n for n in program.graph.nodes if n.op == "placeholder" and n.name == name]
    val = node.meta["val"]
    shape = tuple(d if isinstance(d, int) else None for d in val.shape)
    batch = val.shape[0]
    if isinstance(batch, int):
        return shape, (batch, batch), val.dtype
    bounds = program.range_constraints[batch.node.expr]
    return shape, (int(bounds.lower), int(bounds.upper) if bounds.upper.is_Integer else None), val.dtype


def _refuse_other_sizes(program: torch.export.ExportedProgram) -> None:
    """Make every ``program.module()`` check its input's shape, batch and dtype against the exported
    ones first, with a ValueError naming both (torch's guard says ``Guard failed: x.size()[2] == 32``
    or ``x.size()[0] <= 1024``, and a float64 input fails in the first convolution)."""
    expected, (low, high), dtype = _exported_input(program)
    build = program.module

    def check(module, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()), None)
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else None
        fits = got is not None and len(got) == len(expected) and all(e in (None, g) for e, g in zip(expected, got))
        if fits and low <= got[0] and (high is None or got[0] <= high):
            if x.dtype == dtype:
                return None
            raise ValueError(
                f"this program was exported for {dtype} input; got {x.dtype}: give it x.to({dtype}), or export "
                f"again with a {x.dtype} example (and the model in {x.dtype})"
            )
        shown = ", ".join("B" if e is None else str(e) for e in expected)
        b, c, h, w = expected
        batch = f"batch {b}" if b is not None else f"batches {low} to {high}" if high else "any batch"
        if got is not None and len(got) == 4 and got[1:] == (c, h, w):
            remedy = (
                "export with dynamic_batch=True to take other batches"
                if b is not None
                else f"give it {low} to {high} images at a time"
            )
        else:
            remedy = "export again with an example of that size"
        raise ValueError(
            f"this program was exported for {h} x {w} images ([{shown}]: {c} channels, {batch}); got an input "
            f"of shape {got if got is not None else type(x).__name__}: {remedy}"
        )

    def module(*args: Any, **kwargs: Any) -> torch.fx.GraphModule:
        graph_module = build(*args, **kwargs)
        graph_module.register_forward_pre_hook(check, prepend=True, with_kwargs=True)
        return graph_module

    program.module = module


def export_onnx(
    model: Union[nn.Module, torch.export.ExportedProgram],
    example: Optional[torch.Tensor] = None,
    path: Union[str, os.PathLike, None] = None,
    *,
    dynamic_batch: bool = False,
    **kwargs: Any,
):
    """Export to ONNX with the dynamo exporter; returns the ``torch.onnx.ONNXProgram``
    (``.save(path)``, ``.model_proto``) and writes ``path`` if given.

    Args:
        model: a module (exported first by :func:`export_program`, in eval mode) or a program
            :func:`export_program` returned (then no ``example``); InLine layer cores become
            :func:`inline_forward_onnx` subgraphs.
        example: an input batch [B, C, H, W]; the graph is specialised to its image size.
        path: where to save the ``.onnx`` file (None: do not save), atomically; its folder is
            created, and one that cannot be written is a ValueError before the export.
        dynamic_batch: let the batch dimension vary (input ``x``, dimension 0).
        **kwargs: passed to ``torch.onnx.export`` (``opset_version``, ``optimize``, ...);
            ``dynamic_shapes`` to :func:`export_program`.
    """
    if path is not None:
        writable_file(path, "ONNX file")  # before the export's minutes: a missing folder is created
    if isinstance(model, torch.export.ExportedProgram):
        if example is not None or dynamic_batch or "dynamic_shapes" in kwargs:
            raise ValueError("an ExportedProgram has its example and dynamic shapes already: give neither")
        program = model
    else:
        shapes = {"dynamic_shapes": kwargs.pop("dynamic_shapes")} if "dynamic_shapes" in kwargs else {}
        program = export_program(model, example, dynamic_batch=dynamic_batch, **shapes)
    table = {**onnx_translation_table(), **kwargs.pop("custom_translation_table", {})}
    kwargs.setdefault("verbose", False)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):  # the exporter decomposes SDPA here (see export_program)
        onnx_program = torch.onnx.export(program, dynamo=True, custom_translation_table=table, **kwargs)
    if path is not None:
        with atomic_path(path) as tmp:  # a reader never sees half a file; a failed write names the cause
            onnx_program.save(os.fspath(tmp))
    return onnx_program
