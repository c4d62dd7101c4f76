"""Training and evaluation: the paper's recipe on one process or many (torchrun), resumable."""

from .config import Config, configs_dir
from .task import train
from .evaluate import evaluate_checkpoint, inference_throughput, load_trained_model
from .evaluate import accuracy_counts, evaluate, soft_cross_entropy

__all__ = [
    "Config",
    "accuracy_counts",
    "configs_dir",
    "evaluate",
    "evaluate_checkpoint",
    "inference_throughput",
    "load_trained_model",
    "soft_cross_entropy",
    "train",
]
