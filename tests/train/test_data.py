"""Data: IDX / Fashion-MNIST reader, ImageNet-layout folders, device transforms, mixup/cutmix."""

import logging

import numpy as np
import pytest
import torch

from inline_attn.data import (
    RRC,
    EvalTransform,
    ImageFolder,
    Mixup,
    RandAugmentSpec,
    TrainAugment,
    load_fashion_mnist,
    parse_rand_augment,
    read_idx,
    smooth_one_hot,
)
from inline_attn.data.transforms import random_hflip, random_pad_crop

from train_helpers import make_fmnist, make_folder, write_idx


def test_idx_roundtrip_and_fmnist_reader(tmp_path):
    arr = np.arange(2 * 3 * 5, dtype=np.uint8).reshape(2, 3, 5)
    write_idx(tmp_path / "a.gz", arr)
    np.testing.assert_array_equal(read_idx(tmp_path / "a.gz"), arr)
    root = make_fmnist(tmp_path / "fm", n_train=12, n_test=6)
    tr, te = load_fashion_mnist(root, "train"), load_fashion_mnist(root, "test")
    assert tr.images.shape == (12, 1, 28, 28) and tr.images.dtype == torch.uint8
    assert te.labels.tolist() == [0, 1, 2, 3, 4, 5]


def test_idx_rejects_truncated_file(tmp_path):
    arr = np.zeros((4, 28, 28), dtype=np.uint8)
    write_idx(tmp_path / "b.gz", arr)
    import gzip

    raw = gzip.open(tmp_path / "b.gz").read()
    (tmp_path / "c").write_bytes(raw[:-10])
    with pytest.raises(ValueError, match="header says"):
        read_idx(tmp_path / "c")


def test_fmnist_missing_says_how_to_install(tmp_path):
    with pytest.raises(ValueError, match="apt-get install -y dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="apt-get install"):
        load_fashion_mnist(tmp_path / "empty")


def test_folder_reader_layouts_and_errors(tmp_path, caplog):
    root = make_folder(tmp_path / "d", per_class=2)
    ds = ImageFolder(root / "train", 16, train=False, crop_pct=0.875)
    assert ds.classes == ["cat", "dog", "fox"] and len(ds) == 6
    x, y = ds[0]
    assert x.shape == (3, 16, 16) and x.dtype == torch.uint8 and y == 0
    tr = ImageFolder(root / "train", 14, train=True, crop_pct=0.875)
    assert tr[0][0].shape == (3, 16, 16)  # round(14 / 0.875): the device crops or resizes later
    rrc = ImageFolder(root / "train", 14, train=True, rrc=RRC())
    assert rrc[0][0].shape == (3, 14, 14)  # cropped from the whole image by the loader
    # a corrupt image is logged; training substitutes the next readable sample, evaluation
    # returns None for it (to be skipped and counted, never scored twice)
    (root / "train" / "cat" / "0.png").write_bytes(b"not a png at all")
    ds = ImageFolder(root / "train", 16, train=True)
    with caplog.at_level(logging.WARNING, logger="inline_attn.data.folder"):
        x, y = ds[0]
    assert "0.png" in caplog.text and x.shape == (3, 18, 18) and y == 0  # cat/1.png
    assert [ds[i][1] for i in range(len(ds))] == [0, 0, 1, 1, 2, 2]
    ev = ImageFolder(root / "train", 16, train=False)
    assert ev[0] == (None, 0) and ev[1][0].shape == (3, 16, 16)
    # an empty class and a missing folder are clear errors
    (root / "train" / "emu").mkdir()
    with pytest.raises(ValueError, match="emu.*holds no images"):
        ImageFolder(root / "train", 16, train=True)
    with pytest.raises(ValueError, match="does not exist"):
        ImageFolder(tmp_path / "missing", 16, train=True)


@pytest.mark.parametrize("mode", ["mixup", "cutmix"])
def test_mixup_cutmix_soft_targets_match_pixels(mode):
    """Constant images whose value is the class index: every image's mean must equal the
    expected class under its soft target (lam means the same thing in both modes)."""
    K, B = 10, 16
    y = torch.randperm(K)[:8].repeat(2)
    x = y.float().view(B, 1, 1, 1).expand(B, 3, 12, 12).contiguous()
    mix = Mixup(
        K,
        mixup_alpha=0.8 if mode == "mixup" else 0.0,
        cutmix_alpha=1.0 if mode == "cutmix" else 0.0,
        label_smoothing=0.0,
    )
    for _ in range(5):
        xm, t = mix(x, y)
        assert torch.allclose(t.sum(1), torch.ones(B))
        expected = (t * torch.arange(K).float()).sum(1)
        torch.testing.assert_close(xm.mean(dim=(1, 2, 3)), expected, rtol=0, atol=1e-5)


def test_label_smoothing_and_rand_augment_spec():
    t = smooth_one_hot(torch.tensor([2]), 5, 0.1)
    torch.testing.assert_close(t, torch.tensor([[0.02, 0.02, 0.92, 0.02, 0.02]]))
    assert parse_rand_augment("rand-m9-mstd0.5-inc1") == RandAugmentSpec(2, 9.0, 0.5, True, None)
    assert parse_rand_augment("rand-m7-n3") == RandAugmentSpec(3, 7.0, 0.0, False, None)
    assert parse_rand_augment("rand") == RandAugmentSpec(2, 10.0, 0.0, False, None)  # timm's defaults
    for bad, msg in (
        ("autoaug-v0", "RandAugment"),
        ("rand-m9-x3", "unknown field 'x3'"),
        ("rand-m9-mstd", "cannot parse field 'mstd'"),
        ("rand-w1", "only weight set w0"),
    ):
        with pytest.raises(ValueError, match=msg):
            parse_rand_augment(bad)


def test_pad_crop_flip_and_eval_transform():
    x = torch.arange(2 * 1 * 6 * 6, dtype=torch.float32).view(2, 1, 6, 6)
    y = random_pad_crop(x, 2)
    assert y.shape == x.shape
    # every output is a shifted window of the zero-padded image
    xp = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for b in range(2):
        assert any(torch.equal(y[b, 0], xp[b, 0, i : i + 6, j : j + 6]) for i in range(5) for j in range(5))
    assert torch.equal(random_hflip(x, 1.0), x.flip(-1)) and torch.equal(random_hflip(x, 0.0), x)
    ev = EvalTransform(8, (0.5,), (0.25,), crop_pct=0.8)  # shorter side -> floor(8 / 0.8) = 10, centre 8
    out = ev(torch.full((2, 1, 20, 30), 255, dtype=torch.uint8))
    torch.testing.assert_close(out, torch.full((2, 1, 8, 8), 2.0))  # (1 - 0.5) / 0.25
    img = torch.arange(10 * 14, dtype=torch.float32).view(1, 1, 10, 14) / 255  # already 10 high: crop only
    torch.testing.assert_close(ev(img), (img[..., 1:9, 3:11] - 0.5) / 0.25)


def test_pad_crop_resizes_to_img_size_first():
    """crop="pad" at an img_size other than the images': torchvision's Resize((s, s)) then
    RandomCrop(s, padding=p); every output is a window of the resized, zero-padded image."""
    x = torch.randint(0, 256, (6, 1, 28, 28), dtype=torch.uint8)
    for size in (20, 32):
        aug = TrainAugment(
            size, (0.0,), (1.0,), crop="pad", padding=2, hflip=0.0, auto_augment=None, color_jitter=None, re_prob=0.0
        )
        out = aug(x)
        assert out.shape == (6, 1, size, size)
        resized = torch.nn.functional.interpolate(x.float() / 255, (size, size), mode="bicubic", antialias=True)
        padded = torch.nn.functional.pad(resized.clamp(0, 1), (2, 2, 2, 2))
        for b in range(6):
            windows = [padded[b, 0, i : i + size, j : j + size] for i in range(5) for j in range(5)]
            assert any(torch.equal(out[b, 0], w) for w in windows)


def test_pad_crop_at_the_images_size_is_pad_crop_flip_and_normalisation_alone():
    """img_size 28 on 28 x 28 images (the Fashion-MNIST recipes' default): no resampling, the same
    tensors as the pad crop, flip and normalisation by themselves from the same seed."""
    x = torch.randint(0, 256, (8, 1, 28, 28), dtype=torch.uint8)
    aug = TrainAugment(
        28, (0.3,), (0.35,), crop="pad", padding=2, hflip=0.5, auto_augment=None, color_jitter=None, re_prob=0.0
    )
    torch.manual_seed(0)
    got = aug(x)
    torch.manual_seed(0)
    want = (random_hflip(random_pad_crop(x.float() / 255, 2), 0.5) - 0.3) / 0.35
    assert torch.equal(got, want)


def test_train_augment_shapes_on_gray_and_rgb():
    aug = TrainAugment(16, (0.5,), (0.5,), crop="rrc", re_prob=0.5)
    out = aug(torch.randint(0, 256, (6, 1, 20, 20), dtype=torch.uint8))
    assert out.shape == (6, 1, 16, 16) and torch.isfinite(out).all()
    aug = TrainAugment(16, (0.5,) * 3, (0.5,) * 3, crop="pad", auto_augment=None, color_jitter=0.4)
    out = aug(torch.randint(0, 256, (6, 3, 16, 16), dtype=torch.uint8))
    assert out.shape == (6, 3, 16, 16)
    with pytest.raises(ValueError, match="aug.crop"):
        TrainAugment(16, (0.5,), (0.5,), crop="square")


def _box_checks(boxes, width, height, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= height).all() and (left + w <= width).all()
    area = h * w / (width * height)
    # sides are rounded to whole pixels: area and aspect may leave their ranges by that rounding
    assert area.min() >= scale[0] * 0.97 and area.max() <= scale[1]
    aspect = w / h
    assert aspect.min() >= ratio[0] * 0.97 and aspect.max() <= ratio[1] * 1.03


def test_random_resized_crop_boxes_follow_timms_rule():
    from inline_attn.data import rrc_box, rrc_boxes

    rng = np.random.default_rng(0)
    boxes = np.array([rrc_box(rng, 500, 375, (0.08, 1.0), (3 / 4, 4 / 3)) for _ in range(2000)], dtype=float)
    _box_checks(boxes, 500, 375)
    assert boxes[:, 2].std() > 50  # sizes spread over the scale range
    _box_checks(rrc_boxes(2000, 375, 500, (0.08, 1.0), (3 / 4, 4 / 3)).double().numpy(), 500, 375)
    # no try fits a 1000 x 10 strip at 90 % of its area: timm's fallback, the centre at ratio 4/3
    assert rrc_box(rng, 1000, 10, (0.9, 1.0), (3 / 4, 4 / 3)) == ((10 - 10) // 2, (1000 - 13) // 2, 10, 13)
    assert rrc_boxes(3, 10, 1000, (0.9, 1.0), (3 / 4, 4 / 3)).tolist() == [[0, 493, 10, 13]] * 3


def test_loader_crop_depends_only_on_seed_epoch_and_sample(tmp_path):
    """The training crop of an image folder is the whole image's random resized crop, drawn from
    (seed, epoch, sample): the same wherever (worker, resumed run) it is computed."""
    from PIL import Image

    from inline_attn.data import random_resized_crop_pil

    root = make_folder(tmp_path / "d", per_class=2, size=(40, 64))
    ds = ImageFolder(root / "train", 24, train=True, rrc=RRC(), seed=5)
    ds.set_epoch(3)
    a = ds[4][0]
    again = ImageFolder(root / "train", 24, train=True, rrc=RRC(), seed=5)
    again.set_epoch(3)
    assert torch.equal(a, again[4][0])
    with Image.open(ds.samples[4][0]) as img:
        ref = random_resized_crop_pil(
            img.convert("RGB"), 24, np.random.default_rng((5, 3, 4)), (0.08, 1.0), (3 / 4, 4 / 3)
        )
    assert torch.equal(a, torch.from_numpy(np.array(ref)).permute(2, 0, 1))
    ds.set_epoch(4)
    assert not torch.equal(a, ds[4][0])


@pytest.mark.parametrize(
    "mode, size, crop_pct, resized",
    [
        ("shorter", 224, 0.875, (256, 384)),  # 200 x 300: shorter side 256, longer int(256 * 300 / 200)
        ("squash", 224, 0.875, (256, 256)),  # the authors': int(256 / 224 * 224) square
        ("squash", 384, 1.0, (384, 384)),  # Swin-B-384: squashed to 384, nothing cropped
        ("squash", 384, 0.875, (438, 438)),  # CSwin-B-384: int(256 / 224 * 384)
    ],
)
def test_eval_resize_size_and_crop_on_a_non_square_image(mode, size, crop_pct, resized):
    from PIL import Image

    from inline_attn.data import eval_resize_pil

    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (200, 300, 3)).astype(np.uint8)  # 200 high, 300 wide
    img = Image.fromarray(arr)
    out = eval_resize_pil(img, size, crop_pct, mode)
    assert out.size == (size, size)
    full = img.resize(resized[::-1], Image.BICUBIC)
    top, left = int(round((resized[0] - size) / 2)), int(round((resized[1] - size) / 2))
    assert np.array_equal(np.asarray(out), np.asarray(full)[top : top + size, left : left + size])
    # the device transform: the same resize (torch's antialiased bicubic) and the same crop
    ev = EvalTransform(size, (0.0,) * 3, (1.0,) * 3, crop_pct=crop_pct, resize=mode)
    x = torch.from_numpy(arr).permute(2, 0, 1)[None]
    y = ev(x)
    assert y.shape == (1, 3, size, size)
    want = torch.nn.functional.interpolate(x.float() / 255, size=resized, mode="bicubic", antialias=True).clamp(0, 1)
    torch.testing.assert_close(y, want[..., top : top + size, left : left + size])


def test_folder_eval_layout_squashes(tmp_path):
    from PIL import Image

    root = make_folder(tmp_path / "d", per_class=1, size=(20, 24))
    ds = ImageFolder(root / "val", 16, train=False, crop_pct=0.875, eval_resize="squash")
    x, _ = ds[0]
    with Image.open(ds.samples[0][0]) as img:  # floor(16 / 0.875) = 18 square, centre 16 at offset 1
        ref = np.asarray(img.convert("RGB").resize((18, 18), Image.BICUBIC))[1:17, 1:17]
    assert torch.equal(x, torch.from_numpy(ref.copy()).permute(2, 0, 1))
    with pytest.raises(ValueError, match="eval_resize='crop'"):
        ImageFolder(root / "val", 16, train=False, eval_resize="crop")


@pytest.mark.parametrize("dataset", ["fmnist", "folder"])
def test_a_subset_larger_than_its_set_is_refused_with_both_numbers(dataset, tmp_path):
    """data.val_subset=20 of 6 images scored 6 (and data.subset trained on fewer than asked)."""
    from inline_attn.models import get_model_config
    from inline_attn.train.config import Config
    from inline_attn.train.data import build_datasets, data_info

    if dataset == "fmnist":
        root = make_fmnist(tmp_path / "fm", n_train=12, n_test=6)
        sets = {"training": ("Fashion-MNIST's training split", 12), "validation": ("Fashion-MNIST's test split", 6)}
    else:
        root = make_folder(tmp_path / "imgs", classes=("cat", "dog"), per_class=4)
        sets = {"training": (f"data folder {root / 'train'}", 8), "validation": (f"data folder {root / 'val'}", 8)}

    def build(**subsets):
        ov = [("data.dataset", dataset), ("data.path", str(root)), ("model.name", "inline_deit_tiny")]
        data = Config.load(None, ov + [(f"data.{k}", v) for k, v in subsets.items()]).data
        return build_datasets(data, data_info(data, get_model_config("inline_deit_tiny")))

    for key, split in (("subset", "training"), ("val_subset", "validation")):
        what, size = sets[split]
        with pytest.raises(ValueError) as e:
            build(**{key: size + 1})
        assert str(e.value) == (
            f"data.{key}={size + 1} asks for the first {size + 1} {split} images, but {what} holds {size}; "
            f"give at most {size} (0: all)"
        )
    tr, va, _ = build(subset=sets["training"][1], val_subset=3)  # the whole set, and fewer, are taken
    assert (len(tr), len(va)) == (sets["training"][1], 3)
