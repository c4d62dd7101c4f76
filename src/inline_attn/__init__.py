"""inline-attn: InLine attention (Han et al., NeurIPS 2024, arXiv 2412.06590) for PyTorch.

Public API:
    ops:    inline_attention, linear_attention, softmax_attention, attention_weights, local_residual
    layers: InLineAttention, LinearAttention, SoftmaxAttention, build_attention, record_attention
    convert: convert (InLine into a timm / torchvision / nn.MultiheadAttention model)
    models: create_model, list_models, get_model_config, load_checkpoint, save_checkpoint, profile,
            save_pretrained, from_pretrained
    export: inline_attn.export.export_onnx (needs the export extra)
"""

from .layers import (
    InLineAttention,
    LinearAttention,
    SoftmaxAttention,
    build_attention,
    hook_attention,
    record_attention,
)
from .models import create_model, from_pretrained, get_model_config, list_models, save_pretrained
from .models.convert import convert
from .models.checkpoint import load_checkpoint, save_checkpoint
from .models.profile import profile
from .ops import attention, attention_weights, inline_attention, linear_attention, local_residual, softmax_attention

__version__ = "0.1.0"

__all__ = [
    "InLineAttention",
    "LinearAttention",
    "SoftmaxAttention",
    "attention",
    "attention_weights",
    "build_attention",
    "convert",
    "create_model",
    "from_pretrained",
    "get_model_config",
    "hook_attention",
    "inline_attention",
    "linear_attention",
    "list_models",
    "load_checkpoint",
    "local_residual",
    "profile",
    "record_attention",
    "save_checkpoint",
    "save_pretrained",
    "softmax_attention",
]
