"""Parameters and multiply-accumulates counted from the model's actual computation.

MACs come from :class:`torch.utils.flop_counter.FlopCounterMode` (which counts 2 FLOPs per
multiply-add; we halve) over one forward pass in eval mode: every matmul, linear and
convolution, attention products included. Scaled-dot-product attention is counted under the
math backend, because the fused CPU kernels report 0. InLine's 3x3 local residual
(``inline_attn.ops.local_residual``) is a grouped convolution, counted as such (9 MACs per
output element), as in the reference. Other elementwise ops (norms, activations, softmax,
additions) are not counted, as in the paper's tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
import torch.nn as nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from .._memory import is_oom

__all__ = ["ProfileResult", "count_params", "format_model_info", "model_info", "profile"]


@dataclass(frozen=True)
class ProfileResult:
    """params: parameter count; macs: multiply-adds of one forward of ``batch_size`` images of
    ``input_size``; macs_by_op: the same split by aten op (mm, addmm, bmm, convolution, ...)."""

    params: int
    macs: int
    input_size: tuple[int, ...]
    batch_size: int = 1
    macs_by_op: dict[str, int] = field(default_factory=dict)

    @property
    def gmacs(self) -> float:
        """MACs per image, in G (the unit of the paper's tables)."""
        return self.macs / self.batch_size / 1e9

    @property
    def mparams(self) -> float:
        return self.params / 1e6


def count_params(model: nn.Module, trainable_only: bool = False) -> int:
    """Parameters of ``model`` (shared parameters counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def profile(model: nn.Module, input_size: Sequence[int] = (3, 224, 224), batch_size: int = 1) -> ProfileResult:
    """Count ``model``'s parameters and the MACs of one forward pass.

    Args:
        model: any module taking an image batch [B, C, H, W]; run in eval mode, no grad (its
            training flag is restored).
        input_size: (C, H, W) of one input.
        batch_size: images per forward (MACs are for the whole batch).

    An input or activations larger than the device's memory is a ValueError naming the input size.
    """
    input_size = tuple(int(s) for s in input_size)
    if len(input_size) != 3 or min(input_size) <= 0:
        raise ValueError(f"input_size must be a positive (C, H, W), got {input_size}")
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    ref = next(model.parameters(), None)
    device = ref.device if ref is not None else torch.device("cpu")
    dtype = ref.dtype if ref is not None and ref.is_floating_point() else torch.float32
    was_training = model.training
    model.eval()
    from torch.utils.flop_counter import FlopCounterMode  # here, not at import: it loads triton (about 1 s)

    counter = FlopCounterMode(display=False)
    try:
        with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), counter:
            model(torch.zeros((batch_size,) + input_size, device=device, dtype=dtype))
    except (RuntimeError, MemoryError) as e:
        if not is_oom(e):
            raise
        shape = "x".join(map(str, (batch_size,) + input_size))
        raise ValueError(
            f"counting the MACs at input {shape} ran out of {device.type} memory "
            f"({str(e).splitlines()[0]}): count them at a smaller input size"
        ) from None
    finally:
        model.train(was_training)
    by_op = {str(op).split(".")[-1]: int(n) // 2 for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return ProfileResult(
        params=count_params(model),
        macs=sum(by_op.values()),
        input_size=input_size,
        batch_size=batch_size,
        macs_by_op=by_op,
    )


def model_info(name: str, img_size: Optional[Sequence[int]] = None, *, macs: bool = True) -> dict:
    """A registered model's parameters, MACs (at ``img_size`` = (H, W), default its input size; None
    without ``macs``) and config, as ``inline-attn info`` reports them."""
    from .registry import create_model, get_model_config

    if img_size is not None and not macs:
        raise ValueError(
            f"--img-size {' '.join(map(str, img_size))} is the size the MACs are counted at: not with --no-macs"
        )
    if img_size is not None and (len(img_size) != 2 or min(img_size) < 1):
        raise ValueError(f"--img-size {' '.join(map(str, img_size))}: expected two positive sizes H W")
    cfg = get_model_config(name)
    model = create_model(name)
    size = cfg.input_size if img_size is None else (cfg.input_size[0], *img_size)
    if macs:
        res = profile(model, size)
        params, n_macs = res.params, res.macs
    else:
        params, n_macs = count_params(model), None
    return {
        "name": cfg.name,
        "params": params,
        "macs": n_macs,
        "gmacs": None if n_macs is None else round(n_macs / 1e9, 4),
        "profiled_input_size": list(size),
        "config": cfg.to_dict(),
    }


def format_model_info(info: dict) -> str:
    """:func:`model_info` as lines: parameters and MACs beside the published figures, then the config."""
    cfg = info["config"]
    size = info["profiled_input_size"]
    lines = [f"{info['name']} ({cfg['family']})"]
    ref = f"  (reference {cfg['num_params']:,})" if cfg.get("num_params") else ""
    lines.append(f"  params        {info['params']:,}" + ref)
    if info["macs"] is not None:
        ref = f"  (published {cfg['macs_g']:.2f} G at {cfg['input_size'][-1]})" if cfg.get("macs_g") else ""
        lines.append(f"  MACs          {info['macs'] / 1e9:.3f} G at {size[1]}x{size[2]}{ref}")
    lines += [f"  {key:13s} {val}" for key, val in cfg.items() if key not in ("name", "family", "num_params", "macs_g")]
    return "\n".join(lines)
