"""Datasets (ImageNet-layout folders, Fashion-MNIST) and batched device-side transforms."""
from .fmnist import DEFAULT_FMNIST_DIR, FMNIST_CLASSES, FMNIST_MEAN, FMNIST_STD, load_fashion_mnist, read_idx
from .folder import ImageFolder, resize_center_crop
from .mixup import Mixup, smooth_one_hot
from .tensor import TensorImageDataset
from .transforms import EvalTransform, Normalize, TrainAugment, parse_rand_augment, random_erasing

__all__ = [
    "DEFAULT_FMNIST_DIR", "EvalTransform", "FMNIST_CLASSES", "FMNIST_MEAN", "FMNIST_STD", "ImageFolder",
    "Mixup", "Normalize", "TensorImageDataset", "TrainAugment", "load_fashion_mnist", "parse_rand_augment",
    "random_erasing", "read_idx", "resize_center_crop", "smooth_one_hot",
]
