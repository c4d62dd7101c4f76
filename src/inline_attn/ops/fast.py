"""Old name of :mod:`inline_attn.ops.eager` (the linear-time PyTorch path), kept for old imports."""

from .eager import inline_attention, linear_attention, local_residual, softmax_attention  # noqa: F401
