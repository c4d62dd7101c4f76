"""The authors' released ImageNet-1k weights: where they are published and a local cache of them.

The thirteen checkpoints of the paper's Table 1 models are published by the authors
(https://github.com/LeapLabTHU/InLine, "Pretrained Models") on Tsinghua University's cloud; the
two 384-px fine-tunes have a config there but no released file. :func:`weights_file` downloads a
file once into torch.hub's cache (``$TORCH_HOME/hub/checkpoints``, default
``~/.cache/torch/hub/checkpoints``) with torch.hub's downloader: a progress bar on stderr, a
temporary file renamed into place when complete (a killed download leaves no torn file), and the
SHA-256 checked where :data:`PUBLISHED_SHA256` records one. Later calls read the cached file.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import sys
import urllib.error
import urllib.parse
from typing import Optional, Union

AUTHORS_REPOSITORY = "https://github.com/LeapLabTHU/InLine"

_CLOUD = "https://cloud.tsinghua.edu.cn/f/{}/?dl=1"

PUBLISHED_WEIGHTS: dict[str, str] = {
    "inline_deit_tiny": _CLOUD.format("1d6b8191ad6d4114b291"),
    "inline_deit_small": _CLOUD.format("2f3898b07e9247f3beb3"),
    "inline_deit_base": _CLOUD.format("10bdd726d4b0435eb34e"),
    "inline_pvt_tiny": _CLOUD.format("90ac52b1555b401eb5e6"),
    "inline_pvt_small": _CLOUD.format("1ab953b2479d433080a3"),
    "inline_pvt_medium": _CLOUD.format("a72aec31e6084bc0a280"),
    "inline_pvt_large": _CLOUD.format("efd91318ba964f01b288"),
    "inline_swin_tiny": _CLOUD.format("32810869fcc34410966b"),
    "inline_swin_small": _CLOUD.format("e9657fd247c04c7cb1a1"),
    "inline_swin_base": _CLOUD.format("bf23564bb64c420aafe1"),
    "inline_cswin_tiny": _CLOUD.format("49fa2ecc543647c4b970"),
    "inline_cswin_small": _CLOUD.format("59f4e65f776f4052b93c"),
    "inline_cswin_base": _CLOUD.format("91e17121df284ae38521"),
}
"""Model name -> the authors' download link (their README's table, checked on 2026-11-27)."""

PUBLISHED_SHA256: dict[str, str] = {}
"""Model name -> the SHA-256 of its published file, where one is known (the authors publish none;
an entry is added from a verified download)."""

PathOrUrl = Union[str, os.PathLike]


def cache_dir() -> pathlib.Path:
    """torch.hub's checkpoint folder: ``$TORCH_HOME/hub/checkpoints`` (torch.hub.get_dir's rules)."""
    import torch.hub

    return pathlib.Path(torch.hub.get_dir()) / "checkpoints"


def _is_url(source: str) -> bool:
    return urllib.parse.urlparse(source).scheme in ("http", "https", "file")


def _cache_name(model_name: Optional[str], url: str) -> str:
    """The published file of ``model_name`` is cached as ``<model_name>.pth``; another URL under the
    last part of its path (torch.hub's convention), or a digest of the URL when that is empty."""
    if model_name is not None and PUBLISHED_WEIGHTS.get(model_name) == url:
        return f"{model_name}.pth"
    base = os.path.basename(urllib.parse.urlparse(url).path)
    return base or f"weights-{hashlib.sha256(url.encode()).hexdigest()[:16]}.pth"


def published_url(model_name: str) -> str:
    """The authors' download link of ``model_name``; a ValueError for a model they released no file for."""
    url = PUBLISHED_WEIGHTS.get(model_name)
    if url is None:
        raise ValueError(
            f"pretrained=True: the authors released no weights for {model_name!r} (released: "
            f"{', '.join(sorted(PUBLISHED_WEIGHTS))}; see {AUTHORS_REPOSITORY}); pass pretrained=PATH or URL "
            "of a checkpoint of this model instead"
        )
    return url


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(url: str, target: pathlib.Path, sha256: Optional[str], progress: bool) -> None:
    import torch.hub

    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"inline-attn: downloading {url} to {target} (once; later calls read the file)", file=sys.stderr)
    try:
        # writes a temporary file in the same folder and moves it into place when complete
        torch.hub.download_url_to_file(url, str(target), hash_prefix=None, progress=progress)
    except (urllib.error.URLError, OSError) as e:
        raise RuntimeError(
            f"could not download {url}: {e}. Without a network, download that file elsewhere and place it at "
            f"{target} (the cache folder follows $TORCH_HOME), or pass pretrained=PATH to a local copy"
        ) from e
    if sha256 is not None:
        found = _sha256(target)
        if found != sha256:
            target.unlink()
            raise RuntimeError(
                f"the file downloaded from {url} has SHA-256 {found}, expected {sha256}; it was removed. "
                "Download it again, or check the link"
            )


def weights_file(
    source: PathOrUrl, *, model_name: Optional[str] = None, sha256: Optional[str] = None, progress: bool = True
) -> pathlib.Path:
    """A local file of weights: ``source`` itself when it is a path, else the cached download of URL ``source``.

    Args:
        source: a local path, or an ``http(s)://`` / ``file://`` URL.
        model_name: the model the weights are for (names the cached copy of a published file and
            picks its recorded SHA-256).
        sha256: the file's expected SHA-256 (default: the recorded one of a published file, if any).
        progress: show torch.hub's progress bar on stderr while downloading.

    A missing local path is a ValueError; a failed download a RuntimeError naming the URL and where
    to place the file by hand; a download with the wrong SHA-256 is removed and reported.
    """
    text = os.fspath(source)
    if not _is_url(text):
        path = pathlib.Path(text).expanduser()
        if not path.is_file():
            raise ValueError(f"pretrained={text!r}: no such file (expected a checkpoint file or an http(s) URL)")
        return path
    target = cache_dir() / _cache_name(model_name, text)
    if sha256 is None and model_name is not None and PUBLISHED_WEIGHTS.get(model_name) == text:
        sha256 = PUBLISHED_SHA256.get(model_name)
    if not target.is_file():
        _download(text, target, sha256, progress)
    return target
