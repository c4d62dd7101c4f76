"""Model-test configuration: the small overrides that drive the registry-wide suite.

``SMALL_OVERRIDES`` has one entry per family (``ModelConfig.family``): constructor overrides
that make every variant of that family small enough for CPU CI. ``img_size`` is also the size
of the test input. A new family adds one entry here; a registered model whose family has no
entry fails the registry suite (nothing is skipped silently). Test helpers live in
``model_helpers.py``.
"""

from __future__ import annotations

import pytest
import torch

# family -> create_model overrides for the registry suite (tests/models/test_registry.py)
SMALL_OVERRIDES: dict[str, dict] = {
    "deit": dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2, num_classes=7),
    "pvt": dict(
        img_size=64,
        embed_dims=(8, 16, 24, 32),
        num_heads=(1, 2, 3, 4),
        mlp_ratios=(2, 2, 2, 2),
        depths=(1, 1, 2, 1),
        num_classes=7,
    ),
    # window 8: stage 1 (16 x 16) has shifted InLine windows; softmax stages shrink their windows
    "swin": dict(img_size=64, embed_dim=8, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4), window_size=8, num_classes=7),
    # IISS at img_size 64: InLine blocks global (splits = maps); stage-3 softmax stripes of 3 over
    # a 4 x 4 map (a remainder stripe of 1), stage 4 global
    "cswin": dict(
        img_size=64,
        embed_dim=8,
        depths=(1, 1, 2, 1),
        num_heads=(2, 2, 2, 2),
        split_size=(1, 2, 3, 2),
        inline_split_size=(16, 8, 4, 2),
        num_classes=7,
    ),
}


def pytest_generate_tests(metafunc):
    # every registered model, so families registered later join the suite automatically
    if "registry_name" in metafunc.fixturenames:
        from inline_attn import list_models

        names = list_models()
        metafunc.parametrize("registry_name", names, ids=names)


@pytest.fixture
def small_overrides(registry_name) -> dict:
    """The family's entry of SMALL_OVERRIDES for ``registry_name`` (fails when missing)."""
    from inline_attn import get_model_config

    family = get_model_config(registry_name).family
    if family not in SMALL_OVERRIDES:
        pytest.fail(f"family {family!r} ({registry_name}) has no entry in tests/models/conftest.py SMALL_OVERRIDES")
    return dict(SMALL_OVERRIDES[family])


@pytest.fixture
def float64():
    """Run a test with float64 as the default dtype (golden comparisons)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


@pytest.fixture(autouse=True)
def _one_thread():
    """Model tests use tiny tensors: one intra-op thread is faster than two (and immune to
    oversubscription when the machine is busy). Restored after each test."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
