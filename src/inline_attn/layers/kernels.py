"""Old name of :mod:`inline_attn.layers.feature_maps` (learned phi), kept for old imports."""

from .feature_maps import AffineReLUFeatureMap, AffineReLUKernel  # noqa: F401
