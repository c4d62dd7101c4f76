"""The launch cache on a CUDA device: a cached launch computes what Triton's own launch computed.

Runs where CUDA is present (``make gpu-check`` runs it); skipped on the CPU test machines, where
the kernels run under the interpreter and the cache is not used (its key is checked against
Triton's binder there: tests/ops/test_launch_cache.py).
"""

from __future__ import annotations

import pytest
import torch

from inline_attn.ops.fused import launch_cache
from inline_attn.ops.fused import triton as launchers

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offset", [0, 1])  # data 16-byte aligned, and not
@pytest.mark.parametrize(
    "side, core", [(7, "stream"), (7, "resident"), (14, "tiled"), (40, "stream")]
)  # the streaming, resident and fused launches, and the split one
def test_a_cached_launch_matches_the_first_one(dtype, offset, side, core):
    b, heads, d = 3, 2, 32
    n, c = side * side, heads * d
    buf = torch.randn(b * n * 3 * c + offset, device="cuda").to(dtype)
    q, k, v = buf[offset:].view(b, n, 3 * c).chunk(3, dim=-1)
    w9 = torch.randn(b, 9, c, device="cuda")
    g = torch.randn(b, n, c, device="cuda").to(dtype)
    args = (heads, d**-0.5, side, side, 0)
    launch_cache._entries.clear()

    def step():
        with launchers.core_kernels(core):
            out = launchers.inline_forward_triton(q, k, v, w9, *args)
            return (out, *launchers.inline_backward_triton(q, k, v, w9, g, *args))

    first = step()  # through Triton's launch, which fills the cache
    assert launch_cache._entries
    assert all(e is not launch_cache._NOT_CACHED for e in launch_cache._entries.values())
    second = step()  # from the cache
    for a, r in zip(second, first):
        assert torch.equal(a, r)
