"""Training and evaluation: the paper's recipe on one process or many (torchrun), resumable."""

from .checkpoint import atomic_save, find_resume
from .config import Config, configs_dir, load_config, save_config
from .ema import ModelEma
from .engine import train
from .evaluate import evaluate_checkpoint, inference_throughput, load_trained_model
from .loop import accuracy_counts, evaluate, soft_cross_entropy
from .optim import CosineSchedule, build_optimizer, no_decay_names, param_groups
from .state import TrainState

__all__ = [
    "Config",
    "CosineSchedule",
    "ModelEma",
    "TrainState",
    "accuracy_counts",
    "atomic_save",
    "build_optimizer",
    "configs_dir",
    "evaluate",
    "evaluate_checkpoint",
    "find_resume",
    "inference_throughput",
    "load_config",
    "load_trained_model",
    "no_decay_names",
    "param_groups",
    "save_config",
    "soft_cross_entropy",
    "train",
]
