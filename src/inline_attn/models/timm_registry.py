"""Our models in timm's registry: ``import inline_attn.models.timm_registry`` (where timm is installed)
registers every variant with timm's ``register_model``, so that ``timm.create_model("inline_swin_tiny",
pretrained=..., features_only=..., out_indices=..., pretrained_cfg_overlay=...)`` builds it, and
``timm.create_model("local-dir:PATH")`` / ``"hf-hub:owner/name"`` reads a
:func:`~inline_attn.save_pretrained` folder (timm passes the folder in ``pretrained_cfg``: ``file``
and ``source="local-dir"``, or ``hf_hub_id`` and ``source="hf-hub"``).

The model's ``pretrained_cfg`` stays a :class:`~inline_attn.models.ModelConfig` (timm reads it as a
mapping: ``.get``, ``[]``, ``.items()``); the overlay's keys replace its fields, the rest go to ``extra``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pathlib
import sys
from typing import Callable, Optional

import torch.nn as nn

from .checkpoint import load_checkpoint
from .hub import HUB_PREFIX, download
from .pretrained import folder_weights
from .registry import ModelConfig, create_model, list_models


def _timm_register():
    try:
        return importlib.import_module("timm.models").register_model
    except ImportError as e:
        raise ImportError("inline_attn.models.timm_registry registers our models with timm: pip install timm") from e


def _as_dict(cfg) -> dict:
    if cfg is None:
        return {}
    return dict(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg)


def overlay_config(cfg: ModelConfig, *layers: Optional[dict]) -> ModelConfig:
    """``cfg`` with the keys of each of ``layers`` (timm's pretrained_cfg, then its overlay): a field's
    key replaces the field, any other key goes to ``extra``; ``architecture`` is our ``name``."""
    fields, extra = {}, dict(cfg.extra)
    for layer in layers:
        for key, value in _as_dict(layer).items():
            key = "name" if key == "architecture" else key
            if key in ModelConfig.__dataclass_fields__ and key != "extra":
                fields[key] = tuple(value) if isinstance(value, list) else value
            elif key != "extra":
                extra[key] = value
    return dataclasses.replace(cfg, **fields, extra=extra)


def _weights_folder(source: dict) -> Optional[pathlib.Path]:
    """The folder timm names in its pretrained_cfg for ``local-dir:`` / ``hf-hub:`` models, or None."""
    if source.get("source") == "local-dir":
        return pathlib.Path(source["file"])
    if source.get("source") == "hf-hub":
        return download(HUB_PREFIX + source["hf_hub_id"])
    return None


def entrypoint(name: str) -> Callable[..., nn.Module]:
    """timm's model function for our variant ``name``."""

    def build(pretrained=False, pretrained_cfg=None, pretrained_cfg_overlay=None, **kwargs) -> nn.Module:
        kwargs.pop("cache_dir", None)  # timm's download cache: ours is torch.hub's
        # a local-dir: / hf-hub: folder's model_args: timm passes them both as this record and one by one
        kwargs.pop("pretrained_model_args", None)
        features_only = kwargs.pop("features_only", False)
        out_indices = kwargs.pop("out_indices", None)
        source = _as_dict(pretrained_cfg)
        folder = _weights_folder(source) if pretrained else None
        model = create_model(name, pretrained=bool(pretrained) and folder is None, **kwargs)
        if folder is not None:
            weights = folder_weights(folder)
            if weights is None:
                raise ValueError(f"{name}: {str(folder)!r} holds no weights (model.safetensors or pytorch_model.bin)")
            load_checkpoint(model, weights, strict=True)
        if features_only:
            model.to_features_only(out_indices)
        model.pretrained_cfg = overlay_config(model.pretrained_cfg, source, pretrained_cfg_overlay)
        return model

    build.__name__ = build.__qualname__ = name
    build.__module__ = __name__
    build.__doc__ = f"{name}: an inline-attn model (inline_attn.create_model) for timm's create_model."
    return build


def register_all(register: Optional[Callable] = None) -> list[str]:
    """Register every variant with ``register`` (default: timm's ``register_model``); returns the names."""
    register = _timm_register() if register is None else register
    module = sys.modules[__name__]
    names = list_models()
    for name in names:
        fn = entrypoint(name)
        setattr(module, name, fn)  # timm's register_model looks the function up in its module
        register(fn)
    return names


if importlib.util.find_spec("timm") is not None:
    register_all()
