"""Model families and the registry. Importing this package registers every variant."""
from .registry import ModelConfig, create_model, get_model_config, list_models, register_model

# Family modules register their variants on import (one line per family).
from . import swin  # noqa: F401,E402
from . import deit  # noqa: F401  (inline_deit_*)
from . import pvt  # noqa: F401  (inline_pvt_*)
from . import cswin  # noqa: F401  (inline_cswin_*)

__all__ = ["ModelConfig", "create_model", "get_model_config", "list_models", "register_model"]
