"""Old name of :mod:`inline_attn.ops.feature_maps` (phi), kept for old imports."""

from .feature_maps import KERNELS, Kernel, get_kernel  # noqa: F401
