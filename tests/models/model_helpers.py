"""Helpers for the model tests (imported as ``from model_helpers import ...``)."""

from __future__ import annotations

import json
import pathlib

import torch

REFERENCE_DIR = pathlib.Path(__file__).resolve().parents[1] / "data" / "reference"
GOLDEN_DIR = REFERENCE_DIR / "golden"
LAYOUT_DIR = REFERENCE_DIR / "state_dicts"


def load_golden(case: str):
    """(kwargs in the reference's own terms, {"input", "output", "model": state dict})."""
    from safetensors.torch import load_file

    meta = json.loads((GOLDEN_DIR / f"{case}.json").read_text())
    tensors = load_file(str(GOLDEN_DIR / f"{case}.safetensors"))
    state = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    return meta, {"input": tensors["input"], "output": tensors["output"], "model": state}


def reference_layout(name: str) -> dict[str, list[int]]:
    """The reference code's state dict of a published model: key -> shape."""
    return json.loads((LAYOUT_DIR / f"{name}.json").read_text())


def meta_model(name: str, **overrides) -> torch.nn.Module:
    """Build a registered model on the meta device (no memory, no init cost)."""
    from inline_attn import create_model

    with torch.device("meta"):
        return create_model(name, **overrides)


def state_layout(model: torch.nn.Module) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def assert_close_rel(out: torch.Tensor, ref: torch.Tensor, rtol: float = 1e-10) -> None:
    """max |out - ref| / max |ref| <= rtol, with the numbers in the message."""
    err = (out - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= rtol * scale, f"max abs diff {err:.3e}, max |ref| {scale:.3e}, rel {err / scale:.3e} > {rtol}"
