"""Training and evaluation: the paper's recipe on one process or many (torchrun), resumable."""
from .checkpoint import atomic_save, find_resume, model_state_dict
from .config import DEFAULTS, load_config, parse_overrides, save_config, set_dotted
from .ema import ModelEma
from .engine import accuracy_counts, evaluate, soft_cross_entropy, train
from .evaluate import evaluate_checkpoint, inference_throughput, load_trained_model
from .optim import CosineSchedule, build_optimizer, no_decay_names, param_groups

__all__ = [
    "CosineSchedule", "DEFAULTS", "ModelEma", "accuracy_counts", "atomic_save", "build_optimizer", "evaluate",
    "evaluate_checkpoint", "find_resume", "inference_throughput", "load_config", "load_trained_model",
    "model_state_dict", "no_decay_names", "param_groups", "parse_overrides", "save_config", "set_dotted",
    "soft_cross_entropy", "train",
]
