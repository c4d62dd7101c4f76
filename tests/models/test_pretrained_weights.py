"""create_model(pretrained=...): the download, the cache, the checks and the errors, end to end against
a checkpoint served over HTTP on 127.0.0.1 (no network needed)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import pathlib
import socket
import threading

import pytest
import torch

from inline_attn import create_model
from inline_attn.models import weights

# a small InLine-DeiT with the variant's 1000 classes: the published file's layout at a test's size
SMALL = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, *args):  # the test's output stays readable
        pass

    def do_GET(self):
        self.requests.append(self.path)
        super().do_GET()


@contextlib.contextmanager
def serve(folder: pathlib.Path, seconds: float = 60.0):
    """An HTTP server on 127.0.0.1 (a free port) serving ``folder``; yields (base URL, request paths).
    It stops when the block ends, or by itself after ``seconds`` should the test hang."""
    handler = type("Handler", (_Quiet,), {"requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    timer = threading.Timer(seconds, server.shutdown)
    timer.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.requests
    finally:
        timer.cancel()
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    """urllib would send the requests to 127.0.0.1 through a proxy named in the environment."""
    for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def published(tmp_path, monkeypatch):
    """inline_deit_tiny's published link pointed at a served ``{"model": state_dict}`` file (the
    authors' format) of a small model; TORCH_HOME in the test's folder. Yields (reference model, requests)."""
    torch.manual_seed(0)
    reference = create_model("inline_deit_tiny", **SMALL).eval()
    served = tmp_path / "served"
    served.mkdir()
    torch.save({"model": reference.state_dict()}, served / "weights.pth")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    with serve(served) as (base, requests):
        monkeypatch.setitem(weights.PUBLISHED_WEIGHTS, "inline_deit_tiny", f"{base}/weights.pth")
        yield reference, requests


def same_weights(a: torch.nn.Module, b: torch.nn.Module, skip: str = "\0") -> bool:
    sb = b.state_dict()
    return all(torch.equal(v, sb[k]) for k, v in a.state_dict().items() if not k.startswith(skip))


def test_pretrained_true_downloads_once_into_torch_hubs_cache(published, tmp_path, capsys):
    reference, requests = published
    model = create_model("inline_deit_tiny", pretrained=True, **SMALL)
    assert same_weights(model, reference)
    cached = tmp_path / "torch_home" / "hub" / "checkpoints" / "inline_deit_tiny.pth"
    assert cached.is_file()
    assert [p.name for p in cached.parent.iterdir()] == [cached.name]  # no temporary file left beside it
    assert "downloading" in capsys.readouterr().err
    again = create_model("inline_deit_tiny", pretrained=True, **SMALL)
    assert same_weights(again, reference)
    assert requests == ["/weights.pth"]  # the second model read the cached file


def test_pretrained_url_and_path(published, tmp_path):
    reference, _ = published
    served = tmp_path / "served"
    (served / "other.pth").write_bytes((served / "weights.pth").read_bytes())
    url = weights.PUBLISHED_WEIGHTS["inline_deit_tiny"].replace("weights.pth", "other.pth")
    assert same_weights(create_model("inline_deit_tiny", pretrained=url, **SMALL), reference)
    assert (tmp_path / "torch_home" / "hub" / "checkpoints" / "other.pth").is_file()  # torch.hub's naming
    local = tmp_path / "served" / "weights.pth"
    assert same_weights(create_model("inline_deit_tiny", pretrained=str(local), **SMALL), reference)
    assert same_weights(create_model("inline_deit_tiny", pretrained=local, **SMALL), reference)


def test_recorded_checksum_is_checked(published, tmp_path, monkeypatch):
    reference, _ = published
    data = (tmp_path / "served" / "weights.pth").read_bytes()
    monkeypatch.setitem(weights.PUBLISHED_SHA256, "inline_deit_tiny", hashlib.sha256(data).hexdigest())
    assert same_weights(create_model("inline_deit_tiny", pretrained=True, **SMALL), reference)
    cached = tmp_path / "torch_home" / "hub" / "checkpoints" / "inline_deit_tiny.pth"
    cached.unlink()
    monkeypatch.setitem(weights.PUBLISHED_SHA256, "inline_deit_tiny", "0" * 64)
    with pytest.raises(RuntimeError, match="has SHA-256 .* expected 0000"):
        create_model("inline_deit_tiny", pretrained=True, **SMALL)
    assert not cached.exists()  # the wrong file is not kept


def test_new_classifier_keeps_its_fresh_weights(published):
    reference, _ = published
    model = create_model("inline_deit_tiny", pretrained=True, num_classes=10, **SMALL)
    assert model.head.out_features == 10
    assert same_weights(model, reference, skip="head.")


def test_weights_that_do_not_fit_are_refused(published):
    with pytest.raises(ValueError, match="do not fit|does not fit"):
        create_model("inline_deit_tiny", pretrained=True, **{**SMALL, "embed_dim": 32})
    with pytest.raises(ValueError, match="do not fit"):  # the new-classifier path checks the rest too
        create_model("inline_deit_tiny", pretrained=True, num_classes=10, **{**SMALL, "depth": 3})


def test_offline_names_the_url_and_where_to_place_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with socket.socket() as s:  # a port nothing listens on: the download fails as offline
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/x.pth"
    monkeypatch.setitem(weights.PUBLISHED_WEIGHTS, "inline_deit_tiny", url)
    target = tmp_path / "hub" / "checkpoints" / "inline_deit_tiny.pth"
    with pytest.raises(RuntimeError) as err:
        create_model("inline_deit_tiny", pretrained=True, **SMALL)
    assert url in str(err.value) and str(target) in str(err.value) and "pretrained=PATH" in str(err.value)
    assert not target.exists()


def test_bad_pretrained_values(tmp_path):
    with pytest.raises(ValueError, match="released no weights for 'inline_swin_base_384'"):
        create_model("inline_swin_base_384", pretrained=True)
    with pytest.raises(ValueError, match="no such file"):
        create_model("inline_deit_tiny", pretrained=str(tmp_path / "missing.pth"), **SMALL)
    with pytest.raises(ValueError, match="expected True, False, or a checkpoint path or URL"):
        create_model("inline_deit_tiny", pretrained=1, **SMALL)
    with pytest.raises(ValueError, match="not both"):
        create_model("inline_deit_tiny", pretrained=True, checkpoint_path="x.pth", **SMALL)


def test_every_released_model_has_a_link():
    from inline_attn import list_models

    unreleased = {"inline_swin_base_384", "inline_cswin_base_384"}  # configs only in the authors' repository
    assert set(weights.PUBLISHED_WEIGHTS) == set(list_models()) - unreleased
    assert all(u.startswith("https://cloud.tsinghua.edu.cn/f/") for u in weights.PUBLISHED_WEIGHTS.values())
