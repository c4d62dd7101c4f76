"""Model-test fixtures: every registered model as ``registry_name``, its family's small overrides
(``model_helpers.SMALL_OVERRIDES``), float64 and one thread.

A registered model whose family has no entry in ``SMALL_OVERRIDES`` fails the registry suite
(nothing is skipped silently). Test modules import helpers from ``model_helpers``, never from
this file: every test folder has a ``conftest.py``, and a module named ``conftest`` imported by
name is whichever folder's was imported first.
"""

from __future__ import annotations

import pytest
import torch
from model_helpers import SMALL_OVERRIDES


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
        pytest.fail(
            f"family {family!r} ({registry_name}) has no entry in tests/models/model_helpers.py SMALL_OVERRIDES"
        )
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
