"""nn.Modules built on :mod:`inline_attn.ops`."""
from .attention import (
    KERNEL_CHOICES,
    InLineAttention,
    LinearAttention,
    SoftmaxAttention,
    TokenAttention,
    build_attention,
    check_heads,
    make_kernel,
)
from .common import DropPath, Mlp, PreNormBlock, drop_path, init_weights_, to_2tuple
from .kernels import AffineReLUKernel
from .local_residual import LocalResidual
from .record import AttentionRecord, RecordableAttention, attention_layers, hook_attention, record_attention

__all__ = [
    "KERNEL_CHOICES", "AffineReLUKernel", "AttentionRecord", "DropPath", "InLineAttention",
    "LinearAttention", "LocalResidual", "Mlp", "PreNormBlock", "RecordableAttention", "SoftmaxAttention",
    "TokenAttention", "attention_layers", "build_attention", "check_heads",
    "drop_path", "hook_attention", "init_weights_", "make_kernel", "record_attention", "to_2tuple",
]
