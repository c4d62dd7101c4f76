"""Model families and the registry. Importing this package registers every variant."""

from ._base import InLineModel
from ._helpers import PATTERN_KINDS, pattern_stage_count
from .registry import ModelConfig, create_model, get_model_config, list_models, register_model
from .pretrained import from_pretrained, save_pretrained

# Family modules register their variants on import.
from .deit import InLineDeiT  # inline_deit_*
from .pvt import InLinePVT  # inline_pvt_*
from .swin import InLineSwin  # inline_swin_*
from .cswin import InLineCSwin  # inline_cswin_*

__all__ = [
    "InLineCSwin",
    "InLineDeiT",
    "InLineModel",
    "InLinePVT",
    "InLineSwin",
    "PATTERN_KINDS",
    "ModelConfig",
    "create_model",
    "from_pretrained",
    "get_model_config",
    "list_models",
    "pattern_stage_count",
    "register_model",
    "save_pretrained",
]
