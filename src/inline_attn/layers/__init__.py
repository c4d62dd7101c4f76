"""nn.Modules built on :mod:`inline_attn.ops`."""

from .attention import (
    ATTENTION_CHOICES,
    FEATURE_MAP_CHOICES,
    AgentAttention,
    EfficientAttention,
    FocusedLinearAttention,
    HydraAttention,
    InLineAttention,
    LinearAngularAttention,
    ReLUMultiScaleAttention,
    LinearAttention,
    MLLAAttention,
    PolarityAttention,
    SoftmaxAttention,
    TokenAttention,
    build_attention,
    check_heads,
    check_kind,
    make_feature_map,
)
from .common import DropPath, Mlp, PreNormBlock, drop_path, drop_path_rates, init_weights_, to_2tuple, trunc_normal_
from .feature_maps import AffineReLUFeatureMap
from .linear_family import LINEAR_CORES, LinearCore, make_core
from .local_residual import LocalResidual, uses_local_residual
from .options import BlockOptions
from .patch_embed import PatchEmbed, check_images, pad_small_input, tokens_to_nchw
from .pos_embed import resize_pos_embed
from .record import AttentionRecord, RecordableAttention, attention_layers, hook_attention, record_attention

__all__ = [
    "ATTENTION_CHOICES",
    "FEATURE_MAP_CHOICES",
    "LINEAR_CORES",
    "LinearCore",
    "make_core",
    "check_kind",
    "AffineReLUFeatureMap",
    "AgentAttention",
    "AttentionRecord",
    "BlockOptions",
    "DropPath",
    "EfficientAttention",
    "FocusedLinearAttention",
    "HydraAttention",
    "InLineAttention",
    "LinearAngularAttention",
    "ReLUMultiScaleAttention",
    "LinearAttention",
    "LocalResidual",
    "MLLAAttention",
    "Mlp",
    "PatchEmbed",
    "PolarityAttention",
    "PreNormBlock",
    "RecordableAttention",
    "SoftmaxAttention",
    "TokenAttention",
    "attention_layers",
    "build_attention",
    "check_heads",
    "check_images",
    "drop_path",
    "drop_path_rates",
    "hook_attention",
    "init_weights_",
    "make_feature_map",
    "pad_small_input",
    "record_attention",
    "resize_pos_embed",
    "to_2tuple",
    "trunc_normal_",
    "uses_local_residual",
    "tokens_to_nchw",
]
