"""Old name of :mod:`inline_attn.ops.feature_maps` (phi), kept for old imports; its old names
``KERNELS``, ``get_kernel`` and ``Kernel`` warn."""

from .._deprecation import renamed_attributes
from .feature_maps import FEATURE_MAPS, OLD_NAMES, FeatureMap, get_feature_map  # noqa: F401

__getattr__ = renamed_attributes(__name__, OLD_NAMES)
