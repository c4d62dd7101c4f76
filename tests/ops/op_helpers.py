"""Shared by the ops tests: a log of the aten / custom ops a piece of code dispatches."""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OpLog(TorchDispatchMode):
    """Records every dispatched op as (name, [(shape, dtype) of its tensor arguments]); under it
    the fused InLine core runs as its custom op, so its calls and arguments are seen too."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, list]] = []

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = [(tuple(a.shape), a.dtype) for a in args if isinstance(a, torch.Tensor)]
        self.calls.append((func.overloadpacket.__name__, tensors))
        return func(*args, **(kwargs or {}))


# ops that only make views or allocate: no kernel launch on a GPU
NO_LAUNCH = {
    "detach",
    "view",
    "_unsafe_view",
    "t",
    "transpose",
    "expand",
    "as_strided",
    "unsqueeze",
    "squeeze",
    "permute",
    "slice",
    "split",
    "select",
    "alias",
    "split_with_sizes",
    "reshape",
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "promote_types",
}


def writes_an_argument(func) -> bool:
    """Whether the aten op writes into one of its arguments: in place (``add_``, ``copy_``) or an
    ``out=`` variant. It returns that argument, and it launches a kernel."""
    return any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)


class LaunchCount(TorchDispatchMode):
    """Counts the aten ops that launch a kernel (views and allocations do not), by name. An op that
    writes into an argument (``add_``, ``out=``) launches one; an op that returns its input
    unchanged without writing it (a ``to`` to the same dtype) launches nothing."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in NO_LAUNCH and (writes_an_argument(func) or not any(out is a for a in args)):
            self.counts[name] += 1
        return out


def naive_inline_layer(layer, x, feat, p):
    """The InLine layer written with naive ops only: explicit weights, the reference's Conv1d
    predictor (``nn.Sequential.forward`` of the residual), the nine shifted multiply-adds."""
    from inline_attn.ops import naive_attention, naive_local_residual

    b, n, c = x.shape
    h, w = feat
    qkv = layer.qkv(x).view(b, n, 3, layer.num_heads, layer.head_dim)
    q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
    out = naive_attention(q, k, v, kind="inline", scale=layer.scale).transpose(1, 2).reshape(b, n, c)
    v_img = v[:, :, p:].transpose(1, 2).reshape(b, h, w, c).permute(0, 3, 1, 2)
    weights = torch.nn.Sequential.forward(layer.residual, x.mean(1).unsqueeze(-1)).view(b, c, 3, 3)
    res = naive_local_residual(v_img, weights)
    res = torch.cat([out.new_zeros(b, p, c), res.flatten(2).transpose(1, 2)], dim=1)
    return layer.proj(out + res)
