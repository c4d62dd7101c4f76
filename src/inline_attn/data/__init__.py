"""Datasets (ImageNet-layout folders, Fashion-MNIST) and batched device-side transforms."""

from .fmnist import (
    DEFAULT_FMNIST_DIR,
    FMNIST_CLASSES,
    FMNIST_CROP_PCT,
    FMNIST_IMG_SIZE,
    FMNIST_MEAN,
    FMNIST_NUM_CLASSES,
    FMNIST_STD,
    load_fashion_mnist,
    read_idx,
)
from .folder import RRC, ImageFolder
from .mixup import Mixup, smooth_one_hot
from .resolve import DataInfo, check_class_count, folder_split, open_eval_source, parse_source, resolve_data_info
from .tensor import TensorImageDataset
from .crop import EVAL_RESIZE, eval_resize, eval_resize_pil, random_resized_crop_pil, rrc_box, rrc_boxes
from .rand_augment import RandAugment, RandAugmentSpec, parse_rand_augment
from .transforms import EvalTransform, Normalize, RandomResizedCrop, TrainAugment, random_erasing

__all__ = [
    "DEFAULT_FMNIST_DIR",
    "DataInfo",
    "EVAL_RESIZE",
    "EvalTransform",
    "FMNIST_CLASSES",
    "FMNIST_CROP_PCT",
    "FMNIST_IMG_SIZE",
    "FMNIST_MEAN",
    "FMNIST_NUM_CLASSES",
    "FMNIST_STD",
    "ImageFolder",
    "Mixup",
    "Normalize",
    "RandAugment",
    "RandAugmentSpec",
    "RandomResizedCrop",
    "TensorImageDataset",
    "TrainAugment",
    "check_class_count",
    "eval_resize",
    "eval_resize_pil",
    "folder_split",
    "load_fashion_mnist",
    "open_eval_source",
    "parse_rand_augment",
    "parse_source",
    "random_erasing",
    "random_resized_crop_pil",
    "RRC",
    "read_idx",
    "resolve_data_info",
    "rrc_box",
    "rrc_boxes",
    "smooth_one_hot",
]
