"""``save_pretrained(model, dir)`` / ``from_pretrained(dir)``: a model as a folder, Hugging Face's layout.

The folder holds three files:

- ``config.json``: the registered model name (``architecture``), the arguments it was built with
  (``model_args``, :func:`~inline_attn.models.create_model`'s overrides, with the classifier's
  current ``num_classes`` and ``global_pool``), ``features_only`` / ``out_indices``, the weights'
  ``dtype``, and the variant's :class:`~inline_attn.models.ModelConfig` (``pretrained_cfg``: input
  size, mean, std, for the reader's information);
- ``model.safetensors``: the state dict (:func:`~inline_attn.models.checkpoint.save_checkpoint`);
- ``README.md``: the model card (:mod:`.card`: Hub metadata, the paper, the config).

``from_pretrained`` also reads a folder timm wrote for one of these architectures (its
``config.json`` keeps ``num_classes`` / ``global_pool`` at the top level).

``from_pretrained`` rebuilds the model with :func:`create_model` from the config (on the meta device:
no memory and no initialisation) and takes the weights from the file, strictly, so the result is the
saved model. Every file is written atomically.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Optional, Union

import torch
import torch.nn as nn

from .._io import atomic_write_text, writable_dir
from .card import model_card
from .hub import HUB_PREFIX, download
from .checkpoint import load_checkpoint, read_state_dict, save_checkpoint
from .registry import create_model

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TIMM_PICKLE_NAME = "pytorch_model.bin"  # what timm's save_for_hf writes without safe_serialization
CARD_NAME = "README.md"
#: top-level keys timm's save_for_hf writes beside architecture / pretrained_cfg / model_args
TIMM_KEYS = frozenset({"num_classes", "num_features", "global_pool", "label_names", "label_descriptions"})
FORMAT_VERSION = 1

PathLike = Union[str, os.PathLike]


def _to_json(value: Any, key: str) -> Any:
    """JSON form of a constructor argument (tuples become lists); anything else is refused."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_to_json(v, key) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_json(v, key) for k, v in value.items()}
    raise ValueError(
        f"save_pretrained: model argument {key}={value!r} is a {type(value).__name__}, which config.json cannot "
        "hold (numbers, strings, booleans, None and lists of them can); build the model with a named value instead"
    )


def _from_json(value: Any) -> Any:
    """Lists back to tuples (the constructors take tuples for sizes and per-stage values)."""
    if isinstance(value, list):
        return tuple(_from_json(v) for v in value)
    if isinstance(value, dict):
        return {k: _from_json(v) for k, v in value.items()}
    return value


def pretrained_config(model: nn.Module) -> dict:
    """The ``config.json`` content for ``model`` (built by :func:`create_model`)."""
    cfg = getattr(model, "pretrained_cfg", None)
    if cfg is None or not hasattr(model, "model_args"):
        raise ValueError(
            f"save_pretrained needs a model built by inline_attn.create_model (it records the model's name and "
            f"arguments); this {type(model).__name__} has no pretrained_cfg / model_args"
        )
    features_only = bool(getattr(model, "features_only", False))
    pruned = tuple(getattr(model, "pruned_modules", ()))
    if pruned and not features_only and set(pruned) != {"head"}:
        raise ValueError(
            f"save_pretrained: the model was pruned ({', '.join(pruned)}) by prune_intermediate_layers, which "
            "config.json cannot describe; save the full model, or a features_only one"
        )
    args = {k: _to_json(v, k) for k, v in model.model_args.items()}
    if not features_only:  # reset_classifier may have changed the head since the model was built
        for key in ("num_classes", "global_pool"):
            if hasattr(model, key):
                args[key] = _to_json(getattr(model, key), key)
    dtypes = {p.dtype for p in model.parameters()}
    if len(dtypes) > 1:
        raise ValueError(f"save_pretrained: the model's parameters mix dtypes {sorted(map(str, dtypes))}; cast it")
    dtype = str(dtypes.pop()).removeprefix("torch.") if dtypes else "float32"
    return {
        "format_version": FORMAT_VERSION,
        "library": "inline_attn",
        "architecture": cfg.name,
        "model_args": args,
        "features_only": features_only,
        "out_indices": list(model.out_indices) if features_only else None,
        "dtype": dtype,
        "pretrained_cfg": _to_json(cfg.to_dict(), "pretrained_cfg"),
    }


# the keys pretrained_config writes (library and pretrained_cfg describe the model, and are not read back)
_CONFIG_KEYS = frozenset(
    {"format_version", "library", "architecture", "model_args", "features_only", "out_indices", "dtype"}
    | {"pretrained_cfg"}
)


def save_pretrained(model: nn.Module, save_directory: PathLike) -> pathlib.Path:
    """Write ``model`` to ``save_directory`` (created if needed) as ``config.json`` +
    ``model.safetensors``; returns the folder. :func:`from_pretrained` reads it back."""
    folder = pathlib.Path(save_directory)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"save_pretrained: {str(folder)!r} is a file, expected a folder to write into")
    config = pretrained_config(model)  # before any write: a model that cannot be described writes nothing
    writable_dir(folder, "save_pretrained: folder")  # created; one that cannot be written is a ValueError
    save_checkpoint(model, folder / WEIGHTS_NAME, metadata={"model": config["architecture"]})
    atomic_write_text(folder / CONFIG_NAME, json.dumps(config, indent=2, sort_keys=True) + "\n")
    atomic_write_text(folder / CARD_NAME, model_card(config))
    return folder


def _from_timm(config: dict) -> dict:
    """A config.json timm wrote (no ``library`` key, the classifier's settings at the top level) in
    this library's form: ``num_classes`` and ``global_pool`` into ``model_args``, the labels and
    ``num_features`` (facts, not arguments) dropped."""
    if "library" in config or not (TIMM_KEYS & set(config)):
        return config
    args = dict(config.get("model_args") or {})
    for key in ("num_classes", "global_pool"):
        if key in config:
            args.setdefault(key, config[key])
    return {**{k: v for k, v in config.items() if k not in TIMM_KEYS}, "model_args": args}


def read_pretrained_config(folder: PathLike) -> dict:
    """``config.json`` of a :func:`save_pretrained` folder, checked; a ValueError names the file and the problem."""
    if not isinstance(folder, (str, os.PathLike)):
        raise ValueError(f"from_pretrained: folder={folder!r}: expected a folder path or '{HUB_PREFIX}owner/name'")
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise ValueError(f"from_pretrained: {str(folder)!r} is not a folder (expected one written by save_pretrained)")
    path = folder / CONFIG_NAME
    if not path.is_file():
        raise ValueError(f"from_pretrained: {str(path)!r} does not exist (a save_pretrained folder has {CONFIG_NAME})")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"from_pretrained: cannot read {str(path)!r}: {e}") from e
    if not isinstance(config, dict):
        raise ValueError(f"from_pretrained: {str(path)!r} holds a {type(config).__name__}, expected a JSON object")
    config = _from_timm(config)
    expected = {"architecture": str, "model_args": dict}
    for key, kind in expected.items():
        if not isinstance(config.get(key), kind):
            raise ValueError(
                f"from_pretrained: {str(path)!r} has {key}={config.get(key)!r}, expected a {kind.__name__} "
                "(is it a save_pretrained folder?)"
            )
    unknown = sorted(set(config) - _CONFIG_KEYS)
    if unknown:  # a misspelt key would be ignored: the model built without it
        raise ValueError(
            f"from_pretrained: {str(path)!r} has unknown keys {unknown} (known: {', '.join(sorted(_CONFIG_KEYS))})"
        )
    if not isinstance(config.get("features_only", False), bool):
        raise ValueError(
            f"from_pretrained: {str(path)!r} has features_only={config['features_only']!r}, expected true or false"
        )
    if "dtype" in config and not isinstance(getattr(torch, str(config["dtype"]), None), torch.dtype):
        raise ValueError(f"from_pretrained: {str(path)!r} has dtype={config['dtype']!r}, not a torch dtype")
    if "dtype" in config and not getattr(torch, config["dtype"]).is_floating_point:
        raise ValueError(f"from_pretrained: {str(path)!r} has dtype={config['dtype']!r}, expected a floating dtype")
    if config.get("out_indices") is not None and not config.get("features_only"):
        raise ValueError(f"from_pretrained: {str(path)!r} gives out_indices without features_only=true")
    version = config.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise ValueError(
            f"from_pretrained: {str(path)!r} has format_version={version!r}, this library reads {FORMAT_VERSION}"
        )
    return config


def _check_placement(device, dtype) -> None:
    """``from_pretrained``'s ``device`` and ``dtype``: a device this build has, a floating torch.dtype."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"from_pretrained(dtype={dtype!r}): expected a floating torch.dtype such as torch.float16")
    if device is None:
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"from_pretrained(device={device!r}): not a device ({e})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"from_pretrained(device={device!r}): CUDA is not available in this build or machine")


def folder_weights(folder: PathLike) -> Optional[pathlib.Path]:
    """The weights file of a pretrained folder: ``model.safetensors``, else the ``pytorch_model.bin``
    timm writes without safe serialization; None when it holds neither."""
    folder = pathlib.Path(folder)
    return next((folder / n for n in (WEIGHTS_NAME, TIMM_PICKLE_NAME) if (folder / n).is_file()), None)


def _weights_file(folder: pathlib.Path) -> pathlib.Path:
    """:func:`folder_weights`, refused with the names it looked for when the folder holds neither."""
    weights = folder_weights(folder)
    if weights is None:
        raise ValueError(
            f"from_pretrained: {str(folder / WEIGHTS_NAME)!r} does not exist (a save_pretrained folder has "
            f"{WEIGHTS_NAME}; one timm wrote may hold {TIMM_PICKLE_NAME} instead)"
        )
    return weights


def pretrained_model_spec(folder: PathLike) -> tuple[str, dict, pathlib.Path]:
    """``(name, args, weights)`` of a :func:`save_pretrained` folder, for a loader that builds the
    model itself (``inline_attn.train.load_trained_model``): the registered model name, the
    :func:`create_model` arguments and the weights file. Refused as :func:`from_pretrained` refuses
    the folder, and a ``features_only`` folder too (a backbone without its classifier, which
    :func:`create_model` alone does not rebuild: :func:`from_pretrained` reads it)."""
    config = read_pretrained_config(folder)
    folder = pathlib.Path(folder)
    if config.get("features_only"):
        raise ValueError(
            f"{str(folder / CONFIG_NAME)!r} describes a features_only {config['architecture']} (a backbone without "
            "its classifier): read it with inline_attn.from_pretrained"
        )
    return config["architecture"], _from_json(config["model_args"]), _weights_file(folder)


def from_pretrained(
    folder: PathLike, *, device: Union[str, torch.device, None] = None, dtype: Optional[torch.dtype] = None
) -> nn.Module:
    """The model a :func:`save_pretrained` folder holds, in eval mode.

    Args:
        folder: the folder (``config.json`` + ``model.safetensors``), or ``"hf-hub:owner/name"``
            (downloaded through the optional ``huggingface_hub``, :mod:`.hub`).
        device: where to put the model (default CPU).
        dtype: cast the weights to this dtype (default: the saved one, ``config["dtype"]``).

    A missing or unreadable file, an unknown model name, bad arguments (checked as
    :func:`create_model` checks them), weights that do not fit the model, a ``dtype`` that is not a
    floating ``torch.dtype`` or a ``device`` this machine lacks raise ValueError naming it.
    """
    if isinstance(folder, str) and folder.startswith(HUB_PREFIX):
        folder = download(folder)
    config = read_pretrained_config(folder)
    _check_placement(device, dtype)
    folder = pathlib.Path(folder)
    name = config["architecture"]
    weights = _weights_file(folder)
    try:
        # built on the meta device: no memory and no initialisation, the file's tensors become the weights
        with torch.device("meta"):
            model = create_model(name, **_from_json(config["model_args"]))
            if config.get("features_only"):
                model.to_features_only(_from_json(config.get("out_indices")))
    except ValueError as e:
        raise ValueError(f"from_pretrained: {str(folder / CONFIG_NAME)!r}: {e}") from e
    try:
        load_checkpoint(model, weights, strict=True)
    except ValueError as e:
        raise ValueError(f"from_pretrained: {str(weights)!r}: {e}") from e
    unset = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if unset:  # index and mask buffers the family's filter recomputes for the authors' files: ours hold them
        state = read_state_dict(weights)
        model.load_state_dict({n: state[n] for n in unset if n in state}, strict=False, assign=True)
        unset = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if unset:
        raise ValueError(f"from_pretrained: {str(weights)!r} lacks {unset[:5]} ({len(unset)} tensors)")
    # the file's tensors sit at its byte offsets, not 64-byte aligned: BLAS then takes other code paths and
    # rounds differently from the saved model; a copy is aligned and computes exactly as the saved model did
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            t.data = t.data.clone()
    if dtype is None:
        dtype = getattr(torch, config.get("dtype", "float32"))
    return model.to(device=device, dtype=dtype).eval()
