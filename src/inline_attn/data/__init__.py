"""Datasets (ImageNet-layout folders, Fashion-MNIST) and batched device-side transforms."""
from .fmnist import (
    DEFAULT_FMNIST_DIR, FMNIST_CLASSES, FMNIST_CROP_PCT, FMNIST_IMG_SIZE, FMNIST_MEAN, FMNIST_NUM_CLASSES, FMNIST_STD,
    load_fashion_mnist, read_idx,
)
from .folder import ImageFolder, resize_center_crop
from .mixup import Mixup, smooth_one_hot
from .resolve import DataInfo, folder_split, open_eval_source, parse_source, resolve_data_info
from .tensor import TensorImageDataset
from .transforms import EvalTransform, Normalize, TrainAugment, parse_rand_augment, random_erasing

__all__ = [
    "DEFAULT_FMNIST_DIR", "DataInfo", "EvalTransform", "FMNIST_CLASSES", "FMNIST_CROP_PCT", "FMNIST_IMG_SIZE",
    "FMNIST_MEAN", "FMNIST_NUM_CLASSES", "FMNIST_STD", "ImageFolder", "Mixup", "Normalize", "TensorImageDataset",
    "TrainAugment", "folder_split", "load_fashion_mnist", "open_eval_source", "parse_rand_augment", "parse_source",
    "random_erasing", "read_idx", "resize_center_crop", "resolve_data_info", "smooth_one_hot",
]
