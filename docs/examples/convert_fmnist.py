"""Convert a softmax ViT to InLine and fine-tune it, against InLine trained from scratch and the
softmax model trained on: one Fashion-MNIST table (docs/adoption.md).

The ViT is plain PyTorch in torchvision's layout (``conv_proj``, a class token,
``nn.TransformerEncoder`` with ``nn.MultiheadAttention``), so :func:`inline_attn.convert` finds its
patch grid and replaces its attention modules. Run::

    python docs/examples/convert_fmnist.py --pretrain-epochs 2 --finetune-epochs 1 --train-images 10000
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import inline_attn
from inline_attn.data.fmnist import FMNIST_MEAN, FMNIST_STD, load_fashion_mnist


class TinyViT(nn.Module):
    """A ViT on 28 x 28 images: 4 x 4 patches (a 7 x 7 grid), a class token, pre-norm encoder."""

    def __init__(self, dim: int = 64, heads: int = 4, depth: int = 4, num_classes: int = 10):
        super().__init__()
        self.conv_proj = nn.Conv2d(1, dim, kernel_size=4, stride=4)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.randn(1, 1 + 49, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(len(x), -1, -1), x], dim=1) + self.pos_embedding
        return self.head(self.norm(self.encoder(x))[:, 0])


def batches(images, labels, batch_size, shuffle, generator=None):
    order = torch.randperm(len(images), generator=generator) if shuffle else torch.arange(len(images))
    mean, std = FMNIST_MEAN[0], FMNIST_STD[0]
    for i in range(0, len(order), batch_size):
        idx = order[i : i + batch_size]
        yield (images[idx].float() / 255 - mean) / std, labels[idx]


def train(model, data, epochs: int, lr: float, seed: int) -> None:
    if epochs == 0:
        return
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    steps = epochs * -(-len(data[0]) // 128)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for x, y in batches(*data, 128, True, g):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()


@torch.no_grad()
def top1(model, data) -> float:
    model.eval()
    hits = sum((model(x).argmax(1) == y).sum().item() for x, y in batches(*data, 500, False))
    return 100.0 * hits / len(data[0])


def main(argv=None) -> list[tuple[str, int, float]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pretrain-epochs", type=int, default=2)
    p.add_argument("--finetune-epochs", type=int, default=1)
    p.add_argument("--train-images", type=int, default=60000)
    p.add_argument("--test-images", type=int, default=10000)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    train_set, test_set = load_fashion_mnist(split="train"), load_fashion_mnist(split="test")
    data = (train_set.images[: args.train_images], train_set.labels[: args.train_images])
    test = (test_set.images[: args.test_images], test_set.labels[: args.test_images])
    e, f = args.pretrain_epochs, args.finetune_epochs
    torch.manual_seed(args.seed)
    softmax = TinyViT()
    train(softmax, data, e, args.lr, args.seed)
    rows = [("softmax", e, top1(softmax, test))]
    converted = copy.deepcopy(softmax)
    changes = inline_attn.convert(converted)
    rows.append(("softmax converted to InLine, before fine-tuning", e, top1(converted, test)))
    train(converted, data, f, args.lr / 4, args.seed + 1)
    rows.append(("softmax converted to InLine, fine-tuned", e + f, top1(converted, test)))
    train(softmax, data, f, args.lr / 4, args.seed + 1)
    rows.append(("softmax trained on (unconverted)", e + f, top1(softmax, test)))
    torch.manual_seed(args.seed)
    scratch = TinyViT()
    inline_attn.convert(scratch)
    train(scratch, data, e + f, args.lr, args.seed)
    rows.append(("InLine from scratch", e + f, top1(scratch, test)))
    print(changes)
    print()
    print(f"| model | epochs | test top-1 (%, {len(test[0])} images) |\n|---|---:|---:|")
    for name, epochs, acc in rows:
        print(f"| {name} | {epochs} | {acc:.2f} |")
    return rows


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"\n({time.perf_counter() - start:.0f} s)")
