"""The Hugging Face Hub, through the optional ``huggingface_hub`` package (``pip install 'inline-attn[hub]'``).

:func:`push_to_hub` uploads a :func:`~inline_attn.save_pretrained` folder (config.json,
model.safetensors, README.md); ``from_pretrained("hf-hub:owner/name")`` downloads one
(:func:`download`) and reads it. timm reads the same repositories (``timm.create_model("hf-hub:...")``
once :mod:`inline_attn.models.timm_registry` is imported).
"""

from __future__ import annotations

import importlib
import pathlib
import tempfile
from typing import Optional

import torch.nn as nn

HUB_PREFIX = "hf-hub:"
FILES = ("config.json", "model.safetensors", "README.md")


def _hub():
    try:
        return importlib.import_module("huggingface_hub")
    except ImportError as e:
        raise ImportError(
            "the Hugging Face Hub needs the huggingface_hub package: pip install 'inline-attn[hub]'"
        ) from e


def _repo_id(source: str) -> str:
    repo = source.removeprefix(HUB_PREFIX)
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ValueError(f"expected 'hf-hub:owner/name', got {source!r}")
    return repo


def download(source: str, *, revision: Optional[str] = None) -> pathlib.Path:
    """``"hf-hub:owner/name"`` -> the local folder of its files (huggingface_hub's cache)."""
    folder = _hub().snapshot_download(repo_id=_repo_id(source), revision=revision, allow_patterns=list(FILES))
    return pathlib.Path(folder)


def push_to_hub(
    model: nn.Module, repo_id: str, *, private: bool = False, commit_message: str = "Upload model", token=None
) -> str:
    """Save ``model`` (:func:`~inline_attn.save_pretrained`) and upload the folder to ``repo_id``
    ("owner/name", created if needed); returns what the upload returns (the commit's URL)."""
    from .pretrained import save_pretrained

    hub = _hub()
    repo = _repo_id(repo_id)
    api = hub.HfApi(token=token)
    api.create_repo(repo_id=repo, private=private, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_pretrained(model, tmp)
        return api.upload_folder(repo_id=repo, folder_path=str(folder), commit_message=commit_message)
