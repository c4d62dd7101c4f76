"""Export refuses what it cannot export, naming it, before the work: a model that is not a module, a
dynamic_batch that is not a bool, an integer or empty example, an ONNX path whose folder cannot be
written (a missing folder is created); the program names the batch range and dtype it takes; a dynamic
batch exported from a batch-1 example varies; the ONNX file is written atomically."""

from __future__ import annotations

import pytest
import torch

from inline_attn import create_model
from inline_attn.export import export_onnx, export_program


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model(
        "inline_deit_tiny", depth=1, embed_dim=16, num_heads=2, img_size=32, patch_size=8, num_classes=3
    ).eval()


@pytest.mark.parametrize(
    "example, message",
    [
        (torch.zeros(1, 3, 32, 32, dtype=torch.uint8), r"example of dtype torch.uint8: export with a floating-point"),
        (torch.zeros(1, 3, 32, 32, dtype=torch.int64), r"example of dtype torch.int64: export with a floating-point"),
        (torch.zeros(0, 3, 32, 32), r"example of shape \(0, 3, 32, 32\): expected at least one image"),
        (torch.zeros(1, 3, 0, 32), r"example of shape \(1, 3, 0, 32\): expected at least one image"),
        (torch.zeros(3, 32, 32), r"example must be an image batch \[B, C, H, W\]"),
    ],
)
def test_a_bad_example_is_refused(model, example, message):
    with pytest.raises(ValueError, match=message):
        export_program(model, example)


def test_a_bad_model_or_dynamic_batch_is_refused(model):
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(ValueError, match="model must be a torch.nn.Module, got Tensor"):
        export_program(x, x)
    with pytest.raises(ValueError, match="dynamic_batch must be a bool, got 'yes'"):
        export_program(model, x, dynamic_batch="yes")


def test_the_program_names_the_batch_range_and_the_dtype_it_takes(model):
    """torch's guard said only `x.size()[0] <= 1024`; a float64 batch failed in the first convolution."""
    module = export_program(model, torch.randn(2, 3, 32, 32), dynamic_batch=True).module()
    with pytest.raises(
        ValueError,
        match=r"3 channels, batches 1 to 1024\); got an input of shape \(1025, 3, 32, 32\): give it 1 to 1024",
    ):
        module(torch.zeros(1025, 3, 32, 32))
    with pytest.raises(ValueError, match=r"exported for torch.float32 input; got torch.float64: give it x.to"):
        module(torch.zeros(2, 3, 32, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"got an input of shape list"):
        module([0.0])


def test_a_dynamic_batch_from_a_batch_1_example_varies(model):
    x = torch.randn(1, 3, 32, 32)
    program = export_program(model, x, dynamic_batch=True)
    with torch.no_grad():
        for b in (1, 3):
            xb = x.repeat(b, 1, 1, 1)
            assert torch.allclose(program.module()(xb), model(xb), atol=1e-5, rtol=1e-5)


def test_an_onnx_file_goes_into_a_new_folder_and_a_blocked_one_is_refused_first(model, tmp_path):
    pytest.importorskip("onnx", reason="export_onnx needs the optional onnx package")
    pytest.importorskip("onnxscript", reason="export_onnx needs the optional onnxscript package")
    import onnx

    blocked = tmp_path / "a-file"
    blocked.write_text("x")
    with pytest.raises(ValueError, match=rf"ONNX file's folder {blocked} is not a folder"):
        export_onnx(model, torch.randn(1, 3, 32, 32), blocked / "m.onnx")
    path = tmp_path / "new" / "folder" / "m.onnx"
    export_onnx(model, torch.randn(1, 3, 32, 32), path)
    onnx.checker.check_model(onnx.load(str(path)))
    assert sorted(p.name for p in path.parent.iterdir()) == ["m.onnx"]  # no temporary file left
