"""Shared test fixtures and helpers."""
from __future__ import annotations

import pathlib

import pytest
import torch

DATA_DIR = pathlib.Path(__file__).parent / "data"
REFERENCE_DIR = DATA_DIR / "reference"  # copied from shared/reference (golden files, state-dict layouts)


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield
