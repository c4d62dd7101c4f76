"""Shape inference: every family builds and runs under ``FakeTensorMode`` and on the meta device at
the sizes it takes for real (whole windows and padded ones), gives the real output's shape, and
leaves the module-level caches holding only real tensors, so the next real forward is exact."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

from inline_attn import create_model
from inline_attn.models import swin

SMALL = {
    "inline_deit_tiny": dict(depth=2, embed_dim=16, num_heads=2, img_size=32, patch_size=4),
    "inline_pvt_tiny": dict(img_size=64, embed_dims=(8, 16, 16, 16), num_heads=(1, 1, 1, 1), depths=(1, 1, 1, 1)),
    "inline_swin_tiny": dict(img_size=64, embed_dim=8, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4), window_size=8),
    "inline_cswin_tiny": dict(img_size=64, embed_dim=8, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2)),
}
# padded sizes (windows, stripes and patches that do not divide), and Swin's whole windows too
CASES = [(name, (50, 70)) for name in sorted(SMALL)] + [("inline_swin_tiny", (64, 64))]


def _cached_tensors() -> list[torch.Tensor]:
    return [t for cache in (swin.shift_window_mask, swin.relative_position_index) for t in cache._store.values()]


@pytest.mark.parametrize("name, size", CASES, ids=lambda v: v if isinstance(v, str) else f"{v[0]}x{v[1]}")
def test_fake_and_meta_forwards_infer_the_real_shape_and_leave_the_real_forward_exact(name, size):
    torch.manual_seed(0)
    kwargs = dict(SMALL[name], num_classes=3)
    model = create_model(name, **kwargs).eval()
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        real = model(x)  # fills the caches with real tensors first
        with FakeTensorMode():
            fake_model = create_model(name, **kwargs).eval()
            fake_out = fake_model(torch.empty(2, 3, *size))
        assert is_fake(fake_out) and fake_out.shape == real.shape
        with torch.device("meta"):
            meta_model = create_model(name, **kwargs).eval()
            meta_out = meta_model(torch.empty(2, 3, *size))
        assert meta_out.is_meta and meta_out.shape == real.shape
        # a real model under FakeTensorMode, as torch.export traces it
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            traced = model(mode.from_tensor(x))
        assert traced.shape == real.shape
        again = model(x)
    assert torch.equal(again, real)
    assert all(type(t) is torch.Tensor and t.device.type == "cpu" for t in _cached_tensors())


@pytest.mark.parametrize("name", sorted(SMALL))
def test_an_empty_batch_gives_an_empty_result_in_every_family(name):
    model = create_model(name, num_classes=3, **SMALL[name]).eval()
    with torch.no_grad():
        out = model(torch.randn(0, 3, 50, 70))
        maps = model.forward_intermediates(torch.randn(0, 3, 50, 70), intermediates_only=True)
    assert out.shape == (0, 3) and all(m.shape[0] == 0 for m in maps)
