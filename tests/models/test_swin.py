"""InLine-Swin: golden outputs of the authors' code, state-dict layouts, any input size, masks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_helpers import assert_close_rel, count_params, load_golden, meta_model, reference_layout, state_layout

from inline_attn import create_model, get_model_config, load_checkpoint, record_attention
from inline_attn.layers import TokenAttention
from inline_attn.models.checkpoint import unwrap_state_dict
from inline_attn.models.swin import InLineSwin, SwinBlock, WindowAttention, checkpoint_filter_fn, shift_window_mask

SWIN_MODELS = ["inline_swin_tiny", "inline_swin_small", "inline_swin_base", "inline_swin_base_384"]
PUBLISHED_PARAMS = {
    "inline_swin_tiny": 29_223_544,
    "inline_swin_small": 49_793_296,
    "inline_swin_base": 88_350_120,
    "inline_swin_base_384": 88_465_320,
}

# the reference InLineSwin's arguments: same name here, or renamed
_SAME_NAME = {
    "img_size",
    "patch_size",
    "in_chans",
    "num_classes",
    "embed_dim",
    "depths",
    "num_heads",
    "window_size",
    "mlp_ratio",
    "qkv_bias",
    "drop_rate",
    "attn_drop_rate",
    "drop_path_rate",
}
_RENAMED = {"attn_type": "pattern"}


def swin_kwargs(ref_kwargs: dict) -> dict:
    unknown = set(ref_kwargs) - _SAME_NAME - set(_RENAMED)
    assert not unknown, f"reference arguments without a mapping: {unknown}"
    return {_RENAMED.get(k, k): v for k, v in ref_kwargs.items()}


def small(**kw) -> InLineSwin:
    args = dict(img_size=64, embed_dim=8, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4), window_size=8, num_classes=5)
    return InLineSwin(**{**args, **kw}).eval()


# ---------------------------------------------------------------- faithful to the reference


def test_golden_output_matches_reference(float64):
    meta, data = load_golden("swin_tiny_cfg")
    model = InLineSwin(**swin_kwargs(meta["kwargs"])).eval()
    model.load_state_dict(data["model"], strict=True)
    with torch.no_grad():
        out = model(torch.as_tensor(data["input"]))
    assert out.dtype == torch.float64 and out.shape == tuple(meta["output_shape"])
    assert_close_rel(out, data["output"], rtol=1e-10)


def test_golden_buffers_equal_recomputed_ones():
    # the reference's stored shift mask and relative position index are what we build
    _, data = load_golden("swin_tiny_cfg")
    sd = data["model"]
    mask = shift_window_mask((14, 14), (7, 7), (3, 3), torch.device("cpu"))
    torch.testing.assert_close(sd["layers.2.blocks.3.attn_mask"].float(), mask, rtol=0, atol=0)
    own = small(img_size=224, window_size=56, embed_dim=8, depths=(2, 2, 4, 2), pattern="IIMS2").state_dict()
    for key in ("layers.2.blocks.3.attn.relative_position_index", "layers.3.blocks.0.attn.relative_position_index"):
        torch.testing.assert_close(own[key], sd[key], rtol=0, atol=0)


@pytest.mark.parametrize("name", SWIN_MODELS)
def test_state_dict_layout_and_params_match_reference(name):
    model = meta_model(name)
    assert state_layout(model) == reference_layout(name)
    assert count_params(model) == PUBLISHED_PARAMS[name] == get_model_config(name).num_params


@pytest.mark.parametrize("name", SWIN_MODELS)
def test_published_inline_blocks_are_global(name):
    # window 56 (96 at 384) covers every map an InLine block sees at the published size: no
    # windows, no shift; softmax blocks use 7 (12) windows and shift on odd blocks
    model = meta_model(name)
    size = get_model_config(name).input_size[1] // 4
    softmax_window = 12 if name.endswith("384") else 7
    for i, stage in enumerate(model.layers):
        s = size // 2**i
        for j, blk in enumerate(stage.blocks):
            window, shift = blk.window_geometry(s, s)
            if blk.kind == "inline":
                assert window == (s, s) and shift == (0, 0), (i, j)
            else:
                assert blk.kind == "softmax" and window == (softmax_window,) * 2
                expect = softmax_window // 2 if j % 2 and s > softmax_window else 0
                assert shift == (expect, expect), (i, j)


def test_config_records():
    for name in SWIN_MODELS:
        cfg = get_model_config(name)
        assert cfg.family == "swin" and cfg.classifier == "head" and cfg.interpolation == "bicubic"
    assert get_model_config("inline_swin_base_384").input_size == (3, 384, 384)
    assert [get_model_config(n).paper_top1 for n in SWIN_MODELS[:3]] == [82.4, 83.6, 84.1]


# ---------------------------------------------------------------- ablations from the same code


def test_all_softmax_pattern_is_plain_swin_tiny():
    model = meta_model("inline_swin_tiny", pattern="SSSS")
    assert count_params(model) == 28_288_354  # Swin-T's published parameter count
    assert all(isinstance(b.attn, WindowAttention) for s in model.layers for b in s.blocks)


def test_linear_pattern_and_options():
    model = small(pattern="LLMS1")
    kinds = [[b.kind for b in s.blocks] for s in model.layers]
    assert kinds == [["linear"] * 2, ["linear"] * 2, ["inline", "softmax"], ["softmax"] * 2]
    assert model.layers[0].blocks[0].attn.residual is None  # linear: no local residual by default
    assert model.layers[2].blocks[0].attn.residual is not None
    no_res = small(pattern="IIIS", local_residual=False, feature_map="relu")
    assert not any(".residual." in k for k in no_res.state_dict())
    assert no_res.layers[0].blocks[0].attn.feature_map == "relu"
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(1, 3, 64, 64))).all()


@pytest.mark.parametrize("pattern", ["III", "IIIIS", "IIMS", "IXIS", "", "IIIS2"])
def test_bad_pattern_raises(pattern):
    with pytest.raises(ValueError, match="pattern"):
        small(pattern=pattern)


# ---------------------------------------------------------------- any input size


def _naive_shifted_window_softmax(attn: WindowAttention, x, window, shift):
    """Full-map attention with an explicit pair mask: tokens attend within their shifted window
    and image region only; bias from offsets in the shifted frame. x: [B, H, W, C]."""
    b, h, w, c = x.shape
    (wh, ww), (sh, sw) = window, shift
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    r, cc = ((rows - sh) % h).flatten(), ((cols - sw) % w).flatten()  # position in the shifted frame

    def region(p, length, win, s):
        return (p >= length - win).long() + (p >= length - s).long() if s else torch.zeros_like(p)

    win_id = (r // wh) * w + cc // ww
    label = region(r, h, wh, sh) * 3 + region(cc, w, ww, sw)
    keep = (win_id[:, None] == win_id[None, :]) & (label[:, None] == label[None, :])
    th, tw = attn.window_size
    index = (r[:, None] - r[None, :] + th - 1) * (2 * tw - 1) + cc[:, None] - cc[None, :] + tw - 1
    bias = attn.relative_position_bias_table[index.clamp(0, attn.relative_position_bias_table.shape[0] - 1)]
    qkv = attn.qkv(x.reshape(b, h * w, c)).view(b, h * w, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    logits = qkv[0] @ qkv[1].transpose(-2, -1) * attn.scale + bias.permute(2, 0, 1)
    weights = logits.masked_fill(~keep, float("-inf")).softmax(-1)
    out = (weights @ qkv[2]).transpose(1, 2).reshape(b, h * w, c)
    return attn.proj(out).view(b, h, w, c)


@pytest.mark.parametrize("size", [(14, 21), (21, 14), (14, 14)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_shifted_softmax_window_mask_is_built_for_the_actual_size(float64, size):
    blk = SwinBlock(8, 2, kind="softmax", window_size=7, shift_size=3, input_resolution=(14, 14)).eval()
    torch.nn.init.normal_(blk.attn.relative_position_bias_table, std=1.0)
    x = torch.randn(2, *size, 8)
    with torch.no_grad():
        assert blk.window_geometry(*size) == ((7, 7), (3, 3))
        out = blk._attention(x)
        ref = _naive_shifted_window_softmax(blk.attn, x, (7, 7), (3, 3))
    assert_close_rel(out, ref, rtol=1e-12)


def test_window_indivisible_map_is_zero_padded_as_swin_detection(float64):
    # 10 x 13 map, window 8: padded to 16 x 16 (zeros after norm1), attended, cropped
    for kind in ("inline", "softmax"):
        blk = SwinBlock(8, 2, kind=kind, window_size=8, shift_size=4, input_resolution=(16, 16)).eval()
        x = torch.randn(1, 10, 13, 8)
        with torch.no_grad():
            out = blk._attention(x)
            ref = blk._attention(F.pad(x, (0, 0, 0, 3, 0, 6)))[:, :10, :13]
        torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_window_geometry_per_axis():
    blk = SwinBlock(8, 2, kind="inline", window_size=56, shift_size=28, input_resolution=(56, 56))
    assert blk.window_geometry(56, 56) == ((56, 56), (0, 0))  # the reference's "window >= map"
    assert blk.window_geometry(56, 80) == ((56, 56), (0, 28))  # wider than the window: windows along W
    assert blk.window_geometry(28, 40) == ((28, 40), (0, 0))  # smaller map: one global window
    assert blk.window_geometry(112, 112) == ((56, 56), (28, 28))


@pytest.mark.parametrize("hw", [(224, 320), (100, 132), (62, 90)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_any_input_size_runs(hw):
    # 224 x 320 with the published window 56; 100 x 132 and 62 x 90 leave windows, merges and
    # (62 x 90) the patch stride indivisible
    model = small(img_size=224, window_size=56, depths=(2, 2, 2, 2)) if hw[0] == 224 else small()
    with torch.no_grad():
        out = model(torch.randn(1, 3, *hw))
    assert out.shape == (1, 5) and torch.isfinite(out).all()


def test_features_channels_and_strides():
    model = small().to_features_only()
    assert [f["reduction"] for f in model.feature_info] == [4, 8, 16, 32]
    assert [f["num_chs"] for f in model.feature_info] == [8, 16, 32, 64]
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        feats = model(x)
        odd = model(torch.randn(1, 3, 72, 100))  # 18 x 25 -> 9 x 13 -> 5 x 7 -> 3 x 4
    assert [tuple(f.shape) for f in feats] == [(2, 8, 16, 24), (2, 16, 8, 12), (2, 32, 4, 6), (2, 64, 2, 3)]
    assert [tuple(f.shape[2:]) for f in odd] == [(18, 25), (9, 13), (5, 7), (3, 4)]
    assert not any(k.startswith(("head.", "norm.")) for k in model.state_dict())


def test_forward_intermediates_agree_with_forward():
    model = small()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        final, inter = model.forward_intermediates(x)
        torch.testing.assert_close(final, model.forward_features(x), rtol=0, atol=0)
        last2 = model.forward_intermediates(x, indices=2, intermediates_only=True)
        normed = model.forward_intermediates(x, indices=[-1], norm=True, intermediates_only=True)
        backbone = small().to_features_only(out_indices=(1, 3))
        load_checkpoint(backbone, model.state_dict())
        feats = backbone(x)
    assert [t.shape[1] for t in inter] == [8, 16, 32, 64]
    for a, b in zip(last2, inter[2:]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(normed[0], final.permute(0, 3, 1, 2), rtol=0, atol=0)
    for a, b in zip(feats, [inter[1], inter[3]]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---------------------------------------------------------------- checkpoints, records, training


def test_checkpoint_filter_recomputes_buffers_and_resizes_tables(float64):
    _, data = load_golden("swin_tiny_cfg")
    args = dict(
        img_size=224,
        window_size=56,
        embed_dim=8,
        depths=(2, 2, 4, 2),
        num_heads=(1, 2, 2, 4),
        pattern="IIMS2",
        num_classes=10,
    )
    # built for 256: stored shift masks of another shape; recomputed ones replace them
    model = small(**{**args, "img_size": 256})
    model.load_state_dict(checkpoint_filter_fn(unwrap_state_dict({"model": data["model"]}), model), strict=True)
    with torch.no_grad():
        assert_close_rel(model(data["input"]), data["output"], rtol=1e-10)
    # softmax window 14 (table 27 x 27) from a 7-window checkpoint: tables resized
    wide = small(**{**args, "window_size": 112})
    sd = checkpoint_filter_fn(data["model"], wide)
    assert sd["layers.2.blocks.2.attn.relative_position_bias_table"].shape == (729, 2)
    wide.load_state_dict(sd, strict=True)
    assert InLineSwin.checkpoint_filter_fn is not None and callable(wide.checkpoint_filter_fn)


def test_record_attention_sees_windows_and_mask(float64):
    model = small(img_size=64, window_size=8, pattern="IISS")
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref = model(x)
        with record_attention(model) as records:
            out = model(x)
    assert_close_rel(out, ref, rtol=1e-12)
    assert len(records) == 8
    inline0 = records[1]  # stage 1 (16 x 16), window 8, shifted by 4, InLine
    assert inline0.kind == "inline" and inline0.feat_size == (8, 8)
    assert inline0.weights.shape == (2 * 4, 1, 64, 64) and inline0.token_coords.shape == (4, 64, 2)
    # stage 3 (4 x 4): the softmax window (7) shrinks to the map: one window, coordinates implied
    soft = records[4]
    assert soft.kind == "softmax" and soft.feat_size == (4, 4) and soft.token_coords is None
    # a shifted softmax block on a map larger than its window sees the mask through the hook
    blk = SwinBlock(8, 2, kind="softmax", window_size=4, shift_size=2, input_resolution=(8, 8)).eval()
    with torch.no_grad(), record_attention(blk) as recs:
        blk._attention(torch.randn(1, 8, 8, 8))
    rec = recs[0]
    coords = rec.token_coords  # [4, 16, 2] positions in the map of each window's tokens
    assert coords.shape == (4, 16, 2)
    last = coords[-1]  # the wrapped window holds four image regions
    region = (last[:, 0] >= 6).long() * 2 + (last[:, 1] >= 6).long()
    apart = region[:, None] != region[None, :]
    assert apart.any() and rec.weights[-1][:, apart].max() < 1e-40


def test_every_parameter_gets_a_gradient():
    # the softmax stages' maps (4 x 4, 2 x 2) must hold more than one token for the tables to matter
    model = small(pattern="IISS", drop_path_rate=0.0).train()
    model(torch.randn(1, 3, 64, 64)).sum().backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n


def test_grad_checkpointing_leaves_outputs_and_gradients_unchanged():
    model = small(drop_path_rate=0.2).train()  # checkpointing replays the same drop-path draws
    x = torch.randn(2, 3, 32, 32)
    torch.manual_seed(1)
    ref = model(x)
    ref.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    torch.manual_seed(1)
    out = model(x)
    out.sum().backward()
    torch.testing.assert_close(out, ref)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], msg=n)


def test_contract_methods():
    model = small(pattern="IISS")
    nwd = model.no_weight_decay()
    assert nwd and all(n.endswith("relative_position_bias_table") for n in nwd)
    assert len(nwd) == 4 and model.num_features == 64 and model.num_prefix_tokens == 0
    model.reset_classifier(3)
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, 3)
        assert model.forward_head(model.forward_features(torch.randn(1, 3, 64, 64)), pre_logits=True).shape == (1, 64)
    created = create_model("inline_swin_tiny", img_size=64, embed_dim=8, num_heads=(1, 2, 2, 4), num_classes=4)
    assert created.pretrained_cfg.name == "inline_swin_tiny"
    assert isinstance(created.layers[0].blocks[0].attn, TokenAttention)
