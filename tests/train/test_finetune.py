"""Fine-tuning at a new size as the authors' load_pretrained: tables and position embeddings resized
bicubically, CSwin from the EMA weights, a new head at zero, nothing left at its random init."""

import pytest
import torch
import torch.nn.functional as F

from inline_attn.models import create_model, get_model_config
from inline_attn.train.config import Config
from inline_attn.train.data import data_info
from inline_attn.train.task import build_model
from inline_attn.models.swin import resize_rel_pos_table
from inline_attn.train.finetune import load_initial_weights, resize_pos_embed_bicubic

SMALL_SWIN = dict(embed_dim=16, depths=(1, 1, 2, 1), num_heads=(1, 2, 2, 4))
SMALL_CSWIN = dict(embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4))


def _perturbed_state(model: torch.nn.Module) -> dict:
    """The model's weights plus noise, so that no value equals any fresh initialisation (ones, zeros)."""
    g = torch.Generator().manual_seed(123)
    return {
        k: (v + 0.01 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v)
        for k, v in model.state_dict().items()
    }


def _authors_table(table: torch.Tensor, rows: int) -> torch.Tensor:
    """utils.py:75-80, transcribed: [L1, nH] -> [L2, nH]."""
    L1, nH = table.shape
    S1, S2 = int(L1**0.5), int(rows**0.5)
    out = F.interpolate(table.permute(1, 0).view(1, nH, S1, S1), size=(S2, S2), mode="bicubic")
    return out.view(nH, rows).permute(1, 0)


def _assert_nothing_left_at_init(model, init: dict, expected: dict) -> None:
    for k, p in model.named_parameters():
        assert not torch.equal(p.detach(), init[k]), f"{k} kept its random initialisation"
        torch.testing.assert_close(p.detach(), expected[k], rtol=0, atol=1e-6, msg=k)


def test_swin_224_to_384_resizes_every_relative_position_table(tmp_path):
    src = create_model("inline_swin_base", **SMALL_SWIN)
    state = _perturbed_state(src)
    path = tmp_path / "swin_b.pth"
    torch.save({"model": state, "epoch": 300}, path)  # the authors' checkpoint layout
    torch.manual_seed(1)
    dst = create_model("inline_swin_base_384", **SMALL_SWIN)
    init = {k: v.detach().clone() for k, v in dst.named_parameters()}
    report = load_initial_weights(dst, path)
    tables = [k for k in init if k.endswith("relative_position_bias_table")]
    assert tables and {k for k, _, _ in report.resized} == set(tables) and not report.head_reset
    expected = {}
    for k, v in init.items():
        expected[k] = _authors_table(state[k], v.shape[0]) if k in tables else state[k]
        if k in tables:
            assert state[k].shape[0] == 13**2 and v.shape[0] == 23**2  # softmax windows 7 -> 12
    _assert_nothing_left_at_init(dst, init, expected)


def test_cswin_384_fine_tune_starts_from_the_ema_weights(tmp_path):
    src = create_model("inline_cswin_base", **SMALL_CSWIN)
    weights, ema = _perturbed_state(src), _perturbed_state(src)
    ema = {k: v + 1.0 if v.is_floating_point() else v for k, v in ema.items()}
    path = tmp_path / "last.pth"
    torch.save({"model": weights, "model_ema": ema}, path)  # our training checkpoint's keys
    cfg = Config.load(
        None,
        [
            ("model.name", "inline_cswin_base_384"),
            ("model.kwargs", SMALL_CSWIN),
            ("model.checkpoint", str(path)),
            ("model.checkpoint_ema", True),
            ("model.drop_path", 0.7),
        ],
    )
    torch.manual_seed(1)
    init = {k: v.detach().clone() for k, v in create_model("inline_cswin_base_384", **SMALL_CSWIN).named_parameters()}
    torch.manual_seed(1)
    model = build_model(cfg, data_info(cfg.data, get_model_config(cfg.model.name)).with_classes(1000))
    _assert_nothing_left_at_init(model, init, ema)
    # the authors' released layout ({"state_dict_ema": ...}) maps the same way
    authors = tmp_path / "authors.pth"
    torch.save({"model": weights, "state_dict_ema": ema}, authors)
    again = create_model("inline_cswin_base_384", **SMALL_CSWIN)
    load_initial_weights(again, authors, ema=True)
    assert all(torch.equal(again.state_dict()[k], ema[k]) for k in ema)
    torch.save({"model": weights}, path)
    with pytest.raises(ValueError, match="holds no EMA weights"):
        load_initial_weights(again, path, ema=True)


def test_position_embeddings_resize_bicubically_and_a_new_head_starts_at_zero(tmp_path):
    small = dict(patch_size=16, embed_dim=32, depth=1, num_heads=2)
    src = create_model("inline_deit_tiny", img_size=224, num_classes=10, **small)
    state = _perturbed_state(src)
    path = tmp_path / "deit.pth"
    torch.save(state, path)
    dst = create_model("inline_deit_tiny", img_size=288, num_classes=5, **small)
    report = load_initial_weights(dst, path)
    assert sorted(report.head_reset) == ["head.bias", "head.weight"]
    assert not dst.head.weight.any() and not dst.head.bias.any()
    pos = dst.pos_embed.detach()
    assert pos.shape == (1, 1 + 18 * 18, 32)
    # utils.py:83-104, transcribed: the cls token kept, the 14 x 14 grid resized to 18 x 18 bicubically
    grid = state["pos_embed"][:, 1:].reshape(-1, 14, 14, 32).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=(18, 18), mode="bicubic").permute(0, 2, 3, 1).flatten(1, 2)
    torch.testing.assert_close(pos, torch.cat([state["pos_embed"][:, :1], grid], dim=1), rtol=0, atol=0)
    assert torch.equal(dst.blocks[0].attn.qkv.weight.detach(), state["blocks.0.attn.qkv.weight"])


def test_resize_helpers_refuse_shapes_they_cannot_resize():
    with pytest.raises(ValueError, match="170 rows cannot be resized to 529"):
        resize_rel_pos_table(torch.zeros(170, 4), 529)
    with pytest.raises(ValueError, match="1 vs 0 tokens before the grid"):
        resize_pos_embed_bicubic(torch.zeros(1, 197, 8), 324)


def test_a_checkpoint_of_another_architecture_is_an_error_naming_it(tmp_path):
    src = create_model("inline_deit_tiny", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
    path = tmp_path / "deep.pth"
    torch.save({"model": src.state_dict()}, path)
    dst = create_model("inline_deit_tiny", img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2)
    with pytest.raises(ValueError, match=r"deep.pth.*unexpected keys .*blocks\.1\."):
        load_initial_weights(dst, path)
