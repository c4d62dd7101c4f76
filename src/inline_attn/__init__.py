"""inline-attn: InLine attention (Han et al., NeurIPS 2024, arXiv 2412.06590) for PyTorch.

Public API:
    ops:    inline_attention, linear_attention, softmax_attention, attention_weights, local_residual
    layers: InLineAttention, LinearAttention, SoftmaxAttention, build_attention, record_attention
    convert: convert (InLine into a timm / torchvision / nn.MultiheadAttention model)
    models: create_model, list_models, get_model_config, load_checkpoint, save_checkpoint, profile,
            save_pretrained, from_pretrained
    export: inline_attn.export.export_onnx (needs the export extra)

The names are loaded on first use (PEP 562): ``import inline_attn`` alone imports neither torch nor
the models, so the ``inline-attn`` command starts at once; ``inline_attn.create_model`` (or
``from inline_attn import create_model``) imports what it needs.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> the module that defines it
_ADDRESSES = {
    "InLineAttention": "inline_attn.layers",
    "LinearAttention": "inline_attn.layers",
    "SoftmaxAttention": "inline_attn.layers",
    "build_attention": "inline_attn.layers",
    "hook_attention": "inline_attn.layers",
    "record_attention": "inline_attn.layers",
    "convert": "inline_attn.models.convert",
    "create_model": "inline_attn.models",
    "from_pretrained": "inline_attn.models",
    "get_model_config": "inline_attn.models",
    "list_models": "inline_attn.models",
    "save_pretrained": "inline_attn.models",
    "load_checkpoint": "inline_attn.models.checkpoint",
    "save_checkpoint": "inline_attn.models.checkpoint",
    "profile": "inline_attn.models.profile",
    "attention": "inline_attn.ops",
    "attention_weights": "inline_attn.ops",
    "inline_attention": "inline_attn.ops",
    "linear_attention": "inline_attn.ops",
    "local_residual": "inline_attn.ops",
    "softmax_attention": "inline_attn.ops",
}

__all__ = sorted(_ADDRESSES)


def __getattr__(name: str):
    module = _ADDRESSES.get(name)
    if module is None:
        raise AttributeError(f"module 'inline_attn' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_ADDRESSES})
