"""Helpers for the model tests (imported as ``from model_helpers import ...``).

``SMALL_OVERRIDES`` has one entry per family (``ModelConfig.family``): constructor overrides
that make every variant of that family small enough for CPU CI. ``img_size`` is also the size
of the test input. A new family adds one entry here.
"""

from __future__ import annotations

import json
import pathlib

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
