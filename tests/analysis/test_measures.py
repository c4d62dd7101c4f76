"""The analyses' measures on hand-built queries, keys and weights with known answers."""

from __future__ import annotations

import math

import pytest
import torch

from inline_attn.analysis import (
    ConfusionCounter,
    LocalityMeter,
    MaskingHook,
    QueryMapHook,
    confused_pairs,
    distinct_rows,
    injectivity,
    record_locality,
    renormalize_kept,
    token_layout,
    uniform_locality,
    window_mask,
)
from inline_attn.analysis.injectivity import constructed_problem
from inline_attn.layers import AttentionRecord
from inline_attn.ops import attention_weights


def make_record(weights, feat_size, prefix=0, coords=None, kind="softmax"):
    return AttentionRecord(
        name="blocks.0.attn",
        index=0,
        kind=kind,
        weights=weights,
        feat_size=feat_size,
        num_prefix_tokens=prefix,
        token_coords=coords,
    )


def grid_positions(h, w):
    return [(r, c) for r in range(h) for c in range(w)]


# ----------------------------------------------------------------------------- confusion


@pytest.mark.parametrize("m", [2, 5])
def test_collinear_queries_linear_confuses_every_pair_inline_none(m):
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(1, 1, 12, 6, generator=g, dtype=torch.float64)
    u = torch.randn(6, generator=g, dtype=torch.float64)
    lengths = torch.linspace(0.3, 3.0, m, dtype=torch.float64)
    q = (lengths[:, None] * u)[None, None]  # [1, 1, M, d], collinear, different lengths
    lin = attention_weights(q, keys, kind="linear", feature_map="relu")
    inl = attention_weights(q, keys, kind="inline")
    soft = attention_weights(q, keys, kind="softmax")
    assert int(confused_pairs(lin)) == m * (m - 1) // 2
    assert int(confused_pairs(inl)) == 0
    assert int(confused_pairs(soft)) == 0
    assert distinct_rows(lin[0, 0]) == 1 and distinct_rows(inl[0, 0]) == m


def test_confused_pairs_tolerance_and_valid_mask():
    n = 10
    base = torch.full((n,), 1.0 / n)
    near = base.clone()
    near[0] += 0.5e-3 / n  # within rtol 1e-3 of the uniform weight
    far = base.clone()
    far[0] += 2e-3 / n
    w = torch.stack([base, near, far])[None]  # [1, 3, N]
    assert confused_pairs(w).tolist() == [1]  # base~near only (near~far differ by 1.5e-3/N)
    assert confused_pairs(w, rtol=3e-3).tolist() == [3]
    assert confused_pairs(w, atol=0.0).tolist() == [0]
    valid = torch.tensor([[True, False, True]])
    assert confused_pairs(w, rtol=3e-3, valid=valid).tolist() == [1]


def test_injectivity_figure_counts():
    res = injectivity()["results"]
    m = len(constructed_problem()["lengths"])
    assert res["collinear"]["linear_relu"]["distinct_rows"] == 1
    assert res["collinear"]["linear_relu"]["confused_pairs"] == m * (m - 1) // 2
    assert res["shifted"]["linear_affine"]["distinct_rows"] == 1
    for fam in ("collinear", "shifted"):
        for kind in ("softmax", "inline"):
            assert res[fam][kind]["distinct_rows"] == m
            assert res[fam][kind]["confused_pairs"] == 0
    prob = constructed_problem()
    assert len({tuple(q.tolist()) for q in prob["shifted"]}) == m  # the queries really differ


# ----------------------------------------------------------------------------- neighbourhoods


def test_window_mask_3x3_edges_corners_and_cls():
    h, w = 5, 4
    rec = make_record(torch.zeros(1, 1, 1 + h * w, 1 + h * w), (h, w), prefix=1)
    lay = token_layout(rec)
    near = window_mask(lay, 3)[0]
    assert not near[0].any() and not near[:, 0].any()  # the cls token has no neighbourhood
    pos = grid_positions(h, w)
    for i, (r, c) in enumerate(pos):
        got = {pos[j] for j in near[1 + i, 1:].nonzero().flatten().tolist()}
        want = {(rr, cc) for rr in range(r - 1, r + 2) for cc in range(c - 1, c + 2) if 0 <= rr < h and 0 <= cc < w}
        assert got == want, (r, c)
    counts = near.sum(-1)[1:].view(h, w)
    assert counts[0, 0] == 4 and counts[0, 1] == 6 and counts[2, 1] == 9 and counts[4, 3] == 4


def test_window_mask_uses_image_coordinates_across_a_cyclic_shift():
    # a 4 x 4 map, 2 x 2 windows after a cyclic shift of 1: the window holding (3,3), (3,0),
    # (0,3), (0,0) joins tokens that are adjacent in the window but far apart in the image
    grid = torch.stack(torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij"), -1)
    grid = torch.roll(grid, shifts=(-1, -1), dims=(0, 1))
    coords = grid.view(2, 2, 2, 2, 2).permute(0, 2, 1, 3, 4).reshape(4, 4, 2)  # [G, 4, 2]
    rec = make_record(torch.zeros(8, 1, 4, 4), (2, 2), coords=coords)  # B = 2
    lay = token_layout(rec)
    near = window_mask(lay, 3)
    last = coords[3].tolist()
    assert sorted(map(tuple, last)) == [(0, 0), (0, 3), (3, 0), (3, 3)]
    assert torch.equal(near[3], torch.eye(4, dtype=torch.bool))  # each only its own neighbour
    assert near[0].all()  # window (1..2, 1..2): all four are neighbours


def test_padding_tokens_are_left_out():
    coords = torch.tensor([[[0, 0], [0, 1], [1, 0], [1, 1]]])
    rec = make_record(torch.full((1, 1, 4, 4), 0.25), (2, 2), coords=coords)
    lay = token_layout(rec, map_size=(1, 2))  # row 1 is padding
    assert lay.grid.tolist() == [[True, True, False, False]]
    assert window_mask(lay, 3)[0, 2].sum() == 0


def test_reduced_keys_are_placed_on_the_pooled_grid():
    # PVT's spatial reduction: 8 x 6 queries, keys pooled with stride 2 -> 4 x 3 keys
    rec = make_record(torch.zeros(1, 1, 48, 12), (8, 6))
    lay = token_layout(rec)
    assert lay.key_cell == 2 and lay.key_coords[0, 4].tolist() == [2, 2]  # key (1, 1) covers rows/cols 2..3
    near = window_mask(lay, 3)[0]
    pos = grid_positions(8, 6)
    kpos = grid_positions(4, 3)
    for i, (r, c) in enumerate(pos):
        got = {kpos[j] for j in near[i].nonzero().flatten().tolist()}
        want = {
            (a, b)
            for a in range(4)
            for b in range(3)
            if 2 * a <= r + 1 and 2 * a + 1 >= r - 1 and 2 * b <= c + 1 and 2 * b + 1 >= c - 1
        }
        assert got == want, (r, c)
    assert near[pos.index((3, 3))].sum() == 4 and near[pos.index((0, 0))].sum() == 1


# ----------------------------------------------------------------------------- locality


@pytest.mark.parametrize("prefix", [0, 1])
def test_locality_of_uniform_attention_is_9_over_n(prefix):
    h, w = 6, 7
    n = prefix + h * w
    rec = make_record(torch.full((3, 2, n, n), 1.0 / n), (h, w), prefix=prefix)
    total, count, lay = record_locality(rec, interior_only=True)
    assert count.tolist() == [2 * (h - 2) * (w - 2)] * 3
    assert torch.allclose(total / count, torch.full((3,), 9.0 / n, dtype=torch.double))
    # over all queries (edges clipped) uniform attention gives sum_i |nbhd(i)| / (HW N)
    total, count, lay = record_locality(rec)
    exact = (3 * h - 2) * (3 * w - 2) / (h * w) / n
    assert torch.allclose(total / count, torch.full((3,), exact, dtype=torch.double))
    assert math.isclose(uniform_locality(lay), exact) and math.isclose(uniform_locality(lay, interior_only=True), 9 / n)


@pytest.mark.parametrize("windowed", [False, True])
def test_locality_of_attention_on_the_3x3_neighbourhood_is_1(windowed):
    h, w = 4, 6
    if windowed:  # two 4 x 3 windows side by side
        coords = torch.stack([torch.tensor([(r, c0 + c) for r in range(h) for c in range(3)]) for c0 in (0, 3)])
        rec = make_record(torch.zeros(2 * 2, 1, 12, 12), (4, 3), coords=coords)
    else:
        rec = make_record(torch.zeros(2, 1, 1 + h * w, 1 + h * w), (h, w), prefix=1)
    near = window_mask(token_layout(rec), 3).double()
    wts = near / near.sum(-1, keepdim=True).clamp_min(1)
    wts[:, :, 0] += (near.sum(-1) == 0).double() if not windowed else 0  # cls row: on itself
    rec.weights = wts.repeat(2, 1, 1)[:, None].float()
    total, count, _ = record_locality(rec)
    assert torch.allclose(total / count, torch.ones_like(total))


# ----------------------------------------------------------------------------- masking


def _softmax_record(h=4, w=5, prefix=1, kind="softmax", seed=0):
    g = torch.Generator().manual_seed(seed)
    n = prefix + h * w
    q = torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64)
    return make_record(attention_weights(q, k, kind=kind), (h, w), prefix=prefix, kind=kind), q, k


def test_masking_3x3_removes_exactly_the_neighbourhood():
    h, w = 4, 5
    rec, q, k = _softmax_record(h, w)
    out = MaskingHook("local", 3, renormalize=False)(rec)
    pos = grid_positions(h, w)
    for i, (r, c) in enumerate(pos):
        zero = {pos[j - 1] for j in (out[:, :, 1 + i] == 0).all(0).all(0).nonzero().flatten().tolist()}
        want = {(rr, cc) for rr in range(r - 1, r + 2) for cc in range(c - 1, c + 2) if 0 <= rr < h and 0 <= cc < w}
        assert zero == want, (r, c)  # corners lose 4 keys, edges 6, interior 9
        assert (out[:, :, 1 + i, 0] != 0).all()  # the cls key is never masked
    assert torch.equal(out[:, :, 0], rec.weights[:, :, 0])  # the cls query is untouched
    kept = out != 0
    assert torch.equal(out[kept], rec.weights[kept])


def test_softmax_renormalisation_equals_masking_the_logits():
    rec, q, k = _softmax_record()
    drop = MaskingHook("local", 3).drop_mask(rec)  # [B, N, N]
    want = attention_weights(q, k, kind="softmax", mask=~drop[:, None])
    got = renormalize_kept(rec.weights, ~drop, "softmax")
    assert torch.allclose(got, want, atol=1e-12)


def test_inline_renormalisation_is_inline_over_the_kept_keys():
    rec, q, k = _softmax_record(kind="inline")
    keep = ~MaskingHook("local", 5).drop_mask(rec)
    got = renormalize_kept(rec.weights, keep, "inline")
    assert torch.allclose(got.sum(-1), torch.ones(got.shape[:-1], dtype=got.dtype))
    # by hand, one row: w_ij = phi(q).phi(k_j) - mean_{s kept} phi(q).phi(k_s) + 1/|kept|, with the
    # reference scale d^-0.5 / N on q (N = all keys)
    b, h, i = 1, 2, 7
    sel = keep[b, i]
    s = q.shape[-1] ** -0.5 / q.shape[2]
    dots = s * (q[b, h, i] @ k[b, h].T)
    want = dots[sel] - dots[sel].mean() + 1.0 / int(sel.sum())
    assert torch.allclose(got[b, h, i, sel], want, atol=1e-12)
    assert (got[b, h, i, ~sel] == 0).all()


def test_random_masking_drops_as_many_grid_keys():
    rec, _, _ = _softmax_record(h=5, w=5)
    local = MaskingHook("local", 3).drop_mask(rec)
    rand = MaskingHook("random", 3, seed=3).drop_mask(rec)
    assert torch.equal(local.sum(-1), rand.sum(-1))
    assert not rand[:, :, 0].any() and not rand[:, 0].any()  # cls never drawn, cls query untouched
    assert not torch.equal(local, rand)


def test_masking_rejects_bad_k_and_mode():
    with pytest.raises(ValueError, match="odd positive"):
        MaskingHook("local", 4)
    with pytest.raises(ValueError, match="masking mode"):
        MaskingHook("everything", 3)


@pytest.mark.parametrize("k", [0, 4, -3])
def test_window_mask_and_write_masking_refuse_a_k_that_is_not_odd_and_positive(k, tmp_path):
    """An even k has no centred window (k=4 was a 5x5 one), k < 1 none at all."""
    from inline_attn.analysis import write_masking

    lay = token_layout(make_record(torch.zeros(1, 1, 10, 10), (3, 3), prefix=1))
    with pytest.raises(ValueError, match=rf"k \[{k}\]: window sizes must be odd positive integers"):
        window_mask(lay, k)
    with pytest.raises(ValueError, match=rf"--ks \[{k}\]: window sizes must be odd positive integers"):
        write_masking([], None, tmp_path / "out", ks=(3, k))
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_masked_accuracy_refuses_a_window_wider_than_the_grid_before_any_forward():
    from inline_attn import create_model
    from inline_attn.analysis import masked_accuracy

    # patch 7 on 28 px: 4 x 4 token grids, so k = 5 (or any wider) would be clipped at every query
    model = create_model("inline_deit_tiny", img_size=28, patch_size=7, embed_dim=16, depth=2, num_heads=2)
    forwards = []
    model.register_forward_hook(lambda *args: forwards.append(1))
    batches = [(torch.randn(2, 3, 28, 28), torch.zeros(2, dtype=torch.long))]
    with pytest.raises(ValueError, match=r"--ks \[5, 31\]: layer 'blocks.0.attn' attends over a 4x4 token grid"):
        masked_accuracy(model, batches, ks=(3, 5, 31), progress=False)
    assert not forwards
    rows = masked_accuracy(model, batches, ks=(1, 3), progress=False)
    assert [(r["mask"], r["k"]) for r in rows] == [("none", 0)] + [(m, k) for k in (1, 3) for m in ("local", "random")]


# ----------------------------------------------------------------------------- attention maps


def test_query_map_scatters_rows_by_image_coordinates():
    # two 2 x 2 windows side by side on a 2 x 4 map; every query attends to itself only
    coords = torch.tensor([[[0, 0], [0, 1], [1, 0], [1, 1]], [[0, 2], [0, 3], [1, 2], [1, 3]]])
    rec = make_record(torch.eye(4).expand(2, 3, 4, 4).clone(), (2, 2), coords=coords)  # B = 1
    hook = QueryMapHook([(0.9, 0.6)], map_sizes={"blocks.0.attn": (2, 4)})
    hook(rec)
    m = hook.result()["maps"][0, 0]
    want = torch.zeros(2, 4)
    want[1, 2] = 1.0  # query cell (int(0.9*2), int(0.6*4)) = (1, 2)
    assert torch.equal(m, want)


def test_query_map_global_with_cls():
    h, w = 3, 3
    n = 1 + h * w
    wts = torch.zeros(1, 2, n, n)
    wts[:, :, 0, 0] = 0.5
    wts[:, :, 0, 1:] = 0.5 / 9
    rec = make_record(wts, (h, w), prefix=1)
    hook = QueryMapHook(["cls"])
    hook(rec)
    res = hook.result()
    assert torch.allclose(res["maps"][0, 0], torch.full((3, 3), 0.5 / 9))
    assert torch.allclose(res["cls_weight"], torch.tensor([[0.5]]))


# ----------------------------------------------------------------------------- memory


@pytest.mark.parametrize(
    "make_hook",
    [
        lambda: ConfusionCounter(),
        lambda: LocalityMeter(),
        lambda: MaskingHook("random", 3),
        lambda: QueryMapHook([(0.5, 0.5)]),
    ],
    ids=["confusion", "locality", "masking", "maps"],
)
def test_hooks_keep_no_layer_weights(make_hook):
    """Each layer's N x N weights are freed before the next layer runs (one alive at a time)."""
    import gc
    import weakref

    from inline_attn import create_model
    from inline_attn.layers import hook_attention

    model = create_model(
        "inline_deit_tiny", img_size=16, patch_size=4, embed_dim=8, depth=3, num_heads=2, num_classes=3
    ).eval()
    inner, seen, alive_at_call = make_hook(), [], []

    def hook(rec):
        gc.collect()
        alive_at_call.append(sum(r() is not None for r in seen))
        seen.append(weakref.ref(rec.weights))
        return inner(rec)

    with torch.no_grad(), hook_attention(model, hook):
        model(torch.randn(2, 3, 16, 16))
    assert alive_at_call == [0, 0, 0]
