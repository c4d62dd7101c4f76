"""Export: torch.export keeps the fused InLine core as one custom-op node; ONNX (dynamo exporter, the
core translated by inline_attn.export) run by onnxruntime matches the model, with a dynamic batch;
exporting leaves the model (and every model built later) computing what it computed before."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
import torch
from model_helpers import SMALL_OVERRIDES
from torch.utils._python_dispatch import TorchDispatchMode

import inline_attn.models
from inline_attn import create_model
from inline_attn.export import export_onnx, export_program, inline_forward_onnx, onnx_translation_table
from inline_attn.ops import dispatch, use_impl, why_not_fused

onnx = pytest.importorskip("onnx", reason="the export extra: pip install 'inline-attn[export]'")
ort = pytest.importorskip("onnxruntime", reason="the export extra: pip install 'inline-attn[export]'")

FAMILIES = sorted(SMALL_OVERRIDES)
FUSED_OP = torch.ops.inline_attn.inline_forward.default


# fewer blocks than the registry suite's models (export time grows with the graph): deit one
# InLine block, swin keeps a shifted-window pair in stage 1 (InLine) and in stage 4 (softmax, whose
# windows shift, with the cached shift mask, from 96 x 96 inputs up), cswin a softmax stripe stage;
# one InLine stage at least in each
EXPORT_DEPTHS = {
    "deit": {"depth": 1},
    "pvt": {"depths": (1, 1, 1, 1)},
    "swin": {"depths": (2, 1, 1, 2)},
    "cswin": {"depths": (1, 1, 1, 1)},
}
# input sizes that the windows / stripes / patches do not divide (the model pads); swin's stage 4
# is then 3 x 5 in windows of 2, shifted
PADDED_SIZES = {"deit": (36, 44), "pvt": (72, 88), "swin": (96, 160), "cswin": (72, 88)}


def small_model(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model(f"inline_{family}_tiny", **{**SMALL_OVERRIDES[family], **EXPORT_DEPTHS[family]}).eval()


def images(family: str, batch: int) -> torch.Tensor:
    size = SMALL_OVERRIDES[family]["img_size"]
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(batch))


def clear_tensor_caches() -> None:
    """Empty every module-level cache in inline_attn.models, so that the export that follows is the
    first to build the cached tensors (shift masks, position indices), as in a fresh process."""
    for info in pkgutil.iter_modules(inline_attn.models.__path__, "inline_attn.models."):
        for obj in vars(importlib.import_module(info.name)).values():
            if not isinstance(obj, type) and callable(getattr(obj, "cache_clear", None)):
                obj.cache_clear()


def eager_outputs(model: torch.nn.Module, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(x) for x in xs]


def assert_unchanged(family: str, model: torch.nn.Module, xs: list[torch.Tensor], before: list[torch.Tensor]):
    """The exported model, and one built afterwards, give ``before`` bit for bit (real tensors)."""
    for name, m in (("the exported model", model), ("a model built after the export", small_model(family))):
        for x, out, ref in zip(xs, eager_outputs(m, xs), before):
            assert type(out) is torch.Tensor, f"{family} {tuple(x.shape)}: {name} returns a {type(out).__name__}"
            assert torch.equal(out, ref), f"{family} {tuple(x.shape)}: {name} changed its output"


class CountFusedCalls(TorchDispatchMode):
    """Counts the fused core's calls in an eager forward (under a dispatch mode it runs as the custom op)."""

    calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func == FUSED_OP
        return func(*args, **(kwargs or {}))


def test_fused_kernel_is_what_the_models_run_here():
    # the export tests below are about the fused op: it must be the path the CPU models take
    assert why_not_fused(torch.randn(1, 4, 8)) is None


@pytest.fixture(scope="module", params=FAMILIES)
def exported(request):
    """(family, model, program, before): one torch.export per family, with a dynamic batch;
    ``before``: the model's eager outputs at batches 2 and 3 before it (the first to build the
    cached tensors)."""
    family = request.param
    model = small_model(family)
    before = eager_outputs(model, [images(family, 2), images(family, 3)])
    clear_tensor_caches()
    return family, model, export_program(model, images(family, 2), dynamic_batch=True), before


def test_export_leaves_the_model_unchanged(exported):
    family, model, _, before = exported
    assert_unchanged(family, model, [images(family, 2), images(family, 3)], before)


@pytest.mark.parametrize("family", FAMILIES)
def test_export_at_a_padded_size_leaves_the_model_unchanged(family):
    # a module-level cache once kept the shift mask traced for a padded InLine-Swin: a FakeTensor
    # without values, which every later eager call (of any InLine-Swin) returned. ONNX export
    # traces through export_program; it is the exporter here for swin, the case that broke
    model = small_model(family)
    x = torch.randn(2, 3, *PADDED_SIZES[family], generator=torch.Generator().manual_seed(0))
    before = eager_outputs(model, [x])
    clear_tensor_caches()
    if family == "swin":
        export_onnx(model, x, optimize=False)
    else:
        export_program(model, x)
    assert_unchanged(family, model, [x], before)


def test_torch_export_keeps_the_fused_core_as_one_node(exported):
    family, model, program, _ = exported
    fused = [n for n in program.graph.nodes if n.op == "call_function" and n.target == FUSED_OP]
    with torch.no_grad(), CountFusedCalls() as eager:
        model(images(family, 2))
    assert len(fused) == eager.calls > 0
    for b in (2, 3):  # the batch the program was traced with and another one
        xb = images(family, b)
        with torch.no_grad():
            torch.testing.assert_close(program.module()(xb), model(xb), rtol=1e-5, atol=1e-5)


def test_program_names_the_exported_size_and_the_size_given(exported):
    family, _, program, _ = exported
    s = SMALL_OVERRIDES[family]["img_size"]
    module = program.module()
    for shape in [(2, 3, s + 8, s + 8), (3, 3, s, s + 4), (2, 1, s, s), (3, s, s)]:
        got = str(shape).replace("(", r"\(").replace(")", r"\)")
        match = (
            rf"exported for {s} x {s} images \(\[B, 3, {s}, {s}\]: 3 channels, batches 1 to 1024\); "
            rf"got an input of shape {got}"
        )
        with pytest.raises(ValueError, match=match):
            module(torch.randn(shape))


def test_onnx_export_matches_onnxruntime(tmp_path, exported):
    family, model, program, _ = exported
    path = tmp_path / f"{family}.onnx"
    # the onnxscript optimizer costs tens of seconds per model and does not change the result
    export_onnx(program, path=path, optimize=False)
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    assert {node.domain for node in proto.graph.node} <= {"", "ai.onnx"}  # standard operators only
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    for b in (2, 3):
        xb = images(family, b)
        (out,) = session.run(None, {name: xb.numpy()})
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(out), model(xb), rtol=1e-4, atol=1e-4)


def test_export_onnx_from_a_module():
    # the one-call form (the module exported first); DeiT, the cheapest family
    model, x = small_model("deit"), images("deit", 2)
    proto = export_onnx(model, x, optimize=False).model_proto
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(out), model(x), rtol=1e-4, atol=1e-4)
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 2  # a fixed batch unless asked


def test_translation_table_maps_the_fused_op():
    assert onnx_translation_table() == {FUSED_OP: inline_forward_onnx}


def test_bad_arguments_are_clear_errors():
    model = small_model("deit")
    with pytest.raises(ValueError, match=r"image batch \[B, C, H, W\], got torch.Size\(\[3, 32, 32\]\)"):
        export_onnx(model, torch.randn(3, 32, 32))
    with pytest.raises(ValueError, match="dynamic_batch=True or dynamic_shapes, not both"):
        export_onnx(model, images("deit", 1), dynamic_batch=True, dynamic_shapes=({0: None},))
    program = export_program(model, images("deit", 1))
    with pytest.raises(ValueError, match="ExportedProgram has its example and dynamic shapes already"):
        export_onnx(program, images("deit", 1))
    with pytest.raises(
        ValueError, match=r"\[1, 3, 32, 32\].*batch 1\); got .* \(2, 3, 32, 32\): export with dynamic_batch"
    ):
        program.module()(images("deit", 2))


@pytest.mark.parametrize("family", FAMILIES)
def test_plain_torch_onnx_export_traces_the_eager_path(family, tmp_path):
    # the user's own call, no translation table: ONNX has no fused op, so the layers run eagerly
    # while torch.onnx.export traces (softmax in its explicit-weights form)
    model, x = small_model(family), images(family, 2)
    path = tmp_path / f"{family}.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=True, optimize=False, verbose=False)
    proto = onnx.load(str(path))
    assert {node.domain for node in proto.graph.node} <= {"", "ai.onnx"}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(out), model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_plain_torch_export_keeps_the_fused_core(family):
    model, x = small_model(family), images(family, 2)
    program = torch.export.export(model, (x,))
    assert any(n.target == FUSED_OP for n in program.graph.nodes)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), model(x), rtol=1e-5, atol=1e-5)


def test_why_not_fused_names_an_onnx_export(monkeypatch):
    monkeypatch.setattr(dispatch, "in_onnx_export", lambda: True)
    q = torch.randn(1, 4, 8)
    assert why_not_fused(q) == "torch.onnx.export is tracing the model and ONNX has no fused InLine op"
    assert dispatch.attention_path("auto", "softmax") == "naive"
    assert dispatch.attention_path("auto", "linear") == "eager"


@pytest.mark.parametrize(
    "case", ["use_impl-eager", "relu-feature-map", "use_impl-naive", "plain-torch-onnx"], ids=lambda c: c
)
def test_dynamic_batch_onnx_on_the_eager_paths(case, tmp_path):
    # the eager residual is a grouped convolution over batch x channels, which ONNX cannot take
    # with a dynamic batch: while exporting it is the nine shifted multiply-adds instead
    torch.manual_seed(0)
    phi = {"feature_map": "relu"} if case == "relu-feature-map" else {}
    model = create_model("inline_deit_tiny", **{**SMALL_OVERRIDES["deit"], **EXPORT_DEPTHS["deit"], **phi}).eval()
    x = images("deit", 2)
    impl = {"use_impl-eager": "eager", "use_impl-naive": "naive"}.get(case, "auto")
    path = tmp_path / "model.onnx"
    with use_impl(impl):
        if case == "plain-torch-onnx":
            shapes = ({0: torch.export.Dim("batch", min=1, max=64)},)
            torch.onnx.export(model, (x,), str(path), dynamo=True, dynamic_shapes=shapes, optimize=False)
        else:
            export_onnx(model, x, path, dynamic_batch=True, optimize=False)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    for b in (2, 3):
        xb = images("deit", b)
        (out,) = session.run(None, {name: xb.numpy()})
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(out), model(xb), rtol=1e-4, atol=1e-4)


class FusedCore(torch.nn.Module):
    """The fused core alone, as a module to export: ``inline_forward`` of q, k, v and the taps."""

    def __init__(self, heads: int, scale: float, H: int, W: int, prefix: int):
        super().__init__()
        self.args = (heads, scale, H, W, prefix, "cpu")

    def forward(self, q, k, v, w9):
        return torch.ops.inline_attn.inline_forward(q, k, v, w9, *self.args)


def test_onnx_translation_of_the_core_matches_float64(tmp_path):
    """The translated core against the float64 reference (paper Eq. 5 with explicit weights, and the
    3x3 residual), at a size where every term is of order one: the whole models' logits are too small
    for their 1e-4 tolerance to see an error of 1 % in the attention term, this test sees 1e-5."""
    from inline_attn.ops import naive_attention, naive_local_residual

    b, heads, d, H, W, p = 2, 2, 8, 3, 5, 1
    c, n, scale = heads * d, p + H * W, d**-0.5
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, n, c, generator=gen) for _ in range(3))
    w9 = torch.randn(b, 9, c, generator=gen) / 3
    path = tmp_path / "core.onnx"
    torch.onnx.export(
        FusedCore(heads, scale, H, W, p).eval(),
        (q, k, v, w9),
        str(path),
        dynamo=True,
        custom_translation_table=onnx_translation_table(),
        optimize=False,
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = dict(zip((i.name for i in session.get_inputs()), (t.numpy() for t in (q, k, v, w9))))
    (out,) = session.run(None, feed)

    def split(t):  # [B, N, C] -> [B, h, N, d] in float64
        return t.double().view(b, n, heads, d).transpose(1, 2)

    ref = naive_attention(split(q), split(k), split(v), kind="inline", scale=scale).transpose(1, 2).reshape(b, n, c)
    v_img = v.double()[:, p:].transpose(1, 2).reshape(b, c, H, W)
    res = naive_local_residual(v_img, w9.double().transpose(1, 2).reshape(b, c, 3, 3)).flatten(2).transpose(1, 2)
    ref[:, p:] += res
    attention_term = ref - v.double().mean(1, keepdim=True)  # what a scale error multiplies
    assert attention_term.abs().mean() > 0.1
    torch.testing.assert_close(torch.from_numpy(out).double(), ref, rtol=1e-5, atol=1e-5)
