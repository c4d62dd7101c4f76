"""Training configs: typed sections with their defaults, a YAML file on top, overrides last.

:class:`Config` holds one dataclass per section (``model``, ``data``, ``aug``, ``optim``,
``sched``, ``train``); each field's default, allowed range and help text are declared once, on
the field, and the ``--section.key`` command-line flags are generated from them. A config is
read as a dict (a YAML file, following ``_base_: other.yaml`` first, then ``section.key``
overrides) and converted by :meth:`Config.from_dict`, which checks every value before any work
starts: an unknown key, a wrong type or a value out of range is a ValueError naming the key.
``model.kwargs`` is free-form (constructor arguments for :func:`inline_attn.create_model`).

To add a setting, add a field to its section (with :func:`setting`); YAML, the command line, the
saved ``config.yaml`` and the resume check pick it up.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import pathlib
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Optional, Union

import yaml

from .._io import atomic_write_text
from ..compile import COMPILE_MODES

PathLike = Union[str, os.PathLike]

# the learning rate scales with the total batch: lr = base_lr * total_batch / LR_REFERENCE_BATCH
LR_REFERENCE_BATCH = 512
DEMO_CONFIG = "fmnist/demo.yaml"
_SCI_FLOAT = re.compile(r"[+-]?\d+(\.\d*)?[eE][+-]?\d+")


def setting(
    default: Any = dataclasses.MISSING,
    *,
    doc: str = "",
    ge: Optional[float] = None,
    gt: Optional[float] = None,
    le: Optional[float] = None,
    lt: Optional[float] = None,
    factory: Any = dataclasses.MISSING,
):
    """A config field: its default, its help text and the range a number must lie in."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt}
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelCfg:
    name: str = setting("inline_deit_tiny", doc="registered model name (inline-attn list)")
    kwargs: dict = setting(factory=dict, doc="constructor overrides as a mapping, e.g. '{depth: 4}'")
    drop_path: float = setting(0.1, ge=0, lt=1, doc="stochastic depth rate")
    drop: float = setting(0.0, ge=0, lt=1, doc="dropout rate")
    checkpoint: Optional[str] = setting(
        None,
        doc="initial weights for fine-tuning, ours or the authors' (relative position tables and position "
        "embeddings of another size resized bicubically; a head of another shape starts at zero)",
    )
    checkpoint_ema: bool = setting(
        False, doc="initialise from the checkpoint's EMA weights (model_ema / state_dict_ema)"
    )

    def check(self) -> None:
        from ..models import get_model_config

        try:
            get_model_config(self.name)
        except ValueError as e:
            raise ValueError(f"model.name: {e}") from None
        if self.checkpoint is not None and not pathlib.Path(self.checkpoint).is_file():
            raise ValueError(f"model.checkpoint={self.checkpoint!r}: no such file")


@dataclass
class DataCfg:
    dataset: Literal["folder", "fmnist"] = setting("folder", doc="folder (ImageNet layout: path/train, path/val)")
    path: Optional[str] = setting(None, doc="folder root, or the Fashion-MNIST folder (null: the Debian path)")
    train_split: str = setting("train", doc="training subfolder of data.path")
    val_split: str = setting("val", doc="validation subfolder of data.path")
    img_size: Optional[int] = setting(None, gt=0, doc="null: the dataset's, else the model's input size")
    crop_pct: Optional[float] = setting(None, gt=0, le=1, doc="eval centre-crop fraction (null: the model's)")
    eval_resize: Literal["shorter", "squash"] = setting(
        "shorter",
        doc="eval resize before the centre crop: shorter (the shorter side to img_size / crop_pct, timm) "
        "or squash (the whole image to that square, the authors' Swin code base)",
    )
    interpolation: Optional[Literal["bicubic", "bilinear", "nearest"]] = setting(None, doc="null: the model's")
    mean: Optional[tuple[float, ...]] = setting(None, doc="per-channel mean (null: the dataset's or model's)")
    std: Optional[tuple[float, ...]] = setting(None, doc="per-channel std (null: the dataset's or model's)")
    batch_size: int = setting(128, ge=1, doc="images per process and micro-batch (the authors' per-GPU batch)")
    workers: int = setting(4, ge=0, doc="data loader processes")
    subset: int = setting(0, ge=0, doc="use only the first N training images (0: all)")
    val_subset: int = setting(0, ge=0, doc="use only the first N validation images (0: all)")

    def check(self) -> None:
        for key in ("mean", "std"):
            value = getattr(self, key)
            if value is not None and not value:
                raise ValueError(f"data.{key}=[]: expected one number per channel, or null")
        if self.std is not None and min(self.std) <= 0:
            raise ValueError(f"data.std={list(self.std)}: every value must be > 0")
        if self.mean is not None and self.std is not None and len(self.mean) != len(self.std):
            raise ValueError(f"data.mean has {len(self.mean)} channels but data.std {len(self.std)}")


@dataclass
class AugCfg:
    crop: Literal["rrc", "pad", "none"] = setting("rrc", doc="random resized crop | pad-and-crop | none")
    scale: tuple[float, float] = setting((0.08, 1.0), doc="random resized crop area range")
    ratio: tuple[float, float] = setting((0.75, 1.3333333333333333), doc="random resized crop aspect range")
    padding: int = setting(4, ge=0, doc="pixels of padding for crop=pad")
    hflip: float = setting(0.5, ge=0, le=1, doc="horizontal flip probability")
    auto_augment: Optional[str] = setting("rand-m9-mstd0.5-inc1", doc="RandAugment policy 'rand-m<M>[-n<N>]', or null")
    color_jitter: Optional[float] = setting(0.4, ge=0, doc="used only without auto_augment (timm's rule)")
    re_prob: float = setting(0.25, ge=0, le=1, doc="random erasing probability")
    mixup: float = setting(0.8, ge=0, doc="mixup alpha (0: off)")
    cutmix: float = setting(1.0, ge=0, doc="cutmix alpha (0: off)")
    mixup_prob: float = setting(1.0, ge=0, le=1, doc="probability of mixing a batch")
    mixup_switch_prob: float = setting(0.5, ge=0, le=1, doc="probability of cutmix when both are on")
    smoothing: float = setting(0.1, ge=0, lt=1, doc="label smoothing")

    def check(self) -> None:
        for key in ("scale", "ratio"):
            lo, hi = getattr(self, key)
            if not 0 < lo <= hi:
                raise ValueError(f"aug.{key}={[lo, hi]}: expected 0 < low <= high")
        if self.scale[1] > 1:
            raise ValueError(f"aug.scale={list(self.scale)}: the area fraction cannot exceed 1")
        if self.auto_augment is not None:
            from ..data import parse_rand_augment

            try:
                parse_rand_augment(self.auto_augment)
            except ValueError as e:
                raise ValueError(f"aug.auto_augment={self.auto_augment!r}: {e}") from None


@dataclass
class OptimCfg:
    opt: Literal["adamw", "sgd"] = setting("adamw", doc="optimizer")
    lr: Optional[float] = setting(
        None,
        gt=0,
        doc="absolute lr (sched.warmup_lr and sched.min_lr are then absolute "
        f"too); null: base_lr * total_batch / {LR_REFERENCE_BATCH}",
    )
    base_lr: float = setting(5.0e-4, gt=0, doc=f"lr at a total batch of {LR_REFERENCE_BATCH}")
    weight_decay: float = setting(0.05, ge=0, doc="AdamW weight decay")
    betas: tuple[float, float] = setting((0.9, 0.999), doc="AdamW betas")
    eps: float = setting(1.0e-8, gt=0, doc="AdamW epsilon")
    clip_grad: Optional[float] = setting(5.0, ge=0, doc="max gradient norm (null or 0: off)")
    accum_steps: int = setting(
        1, ge=1, doc="micro-batches per optimizer step (with total_batch: 1 or the number it implies)"
    )
    total_batch: Optional[int] = setting(
        None,
        ge=1,
        doc="images per optimizer step over all processes; accum_steps = total_batch / (data.batch_size "
        "x processes) must be a whole number (null: data.batch_size x processes x accum_steps)",
    )
    no_weight_decay: Optional[tuple[str, ...]] = setting(
        None,
        doc="parameter names (or last name components) exempt from weight decay besides 1-d parameters and "
        "biases (null: the model's no_weight_decay())",
    )

    def check(self) -> None:
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optim.betas={list(self.betas)}: each must be in [0, 1)")


@dataclass
class SchedCfg:
    epochs: int = setting(300, ge=1, doc="cosine epochs (warm-up included); cool-down epochs come after")
    warmup_epochs: float = setting(5.0, ge=0, doc="linear warm-up epochs (fractions allowed)")
    cooldown_epochs: int = setting(10, ge=0, doc="epochs at min_lr after the cosine")
    warmup_lr: float = setting(
        1.0e-6,
        ge=0,
        doc=f"lr at the start of the warm-up, at a total batch of {LR_REFERENCE_BATCH} (scaled like base_lr)",
    )
    min_lr: float = setting(
        1.0e-5,
        ge=0,
        doc=f"lr at the end of the cosine and in the cool-down, at a total batch "
        f"of {LR_REFERENCE_BATCH} (scaled like base_lr)",
    )

    def check(self) -> None:
        if self.warmup_epochs > self.epochs:
            raise ValueError(f"sched.warmup_epochs={self.warmup_epochs} exceeds sched.epochs={self.epochs}")


@dataclass
class TrainCfg:
    output: str = setting("runs/train", doc="output folder")
    seed: int = setting(0, ge=0, doc="random seed")
    deterministic: bool = setting(False, doc="deterministic algorithms (slower)")
    device: str = setting("auto", doc="auto | cpu | cuda | cuda:N")
    amp: Literal["none", "bf16", "fp16", "auto"] = setting(
        "none", doc="none | bf16 | fp16 (CUDA, with a GradScaler) | auto (fp16 on CUDA, none on CPU)"
    )
    compile: bool = setting(False, doc="torch.compile the model (the fused InLine op compiles as one node)")
    compile_mode: Literal[COMPILE_MODES] = setting(
        "default", doc="torch.compile mode when train.compile is on (reduce-overhead: CUDA graphs)"
    )
    channels_last: bool = setting(False, doc="channels-last images and convolutions")
    ema: bool = setting(False, doc="keep an exponential moving average of the weights")
    ema_decay: float = setting(
        0.9996, ge=0, lt=1, doc="EMA decay per optimizer step at a total batch of train.ema_batch"
    )
    ema_batch: Optional[int] = setting(
        4096,
        ge=1,
        doc="total batch at which ema_decay holds: the run uses ema_decay ** (total_batch / ema_batch), "
        "the same averaging horizon in images (null: ema_decay as is)",
    )
    resume: Optional[str] = setting(None, doc="null | auto (the output folder's checkpoint) | a checkpoint path")
    eval_every: int = setting(1, ge=1, doc="evaluate every N epochs (and after the last)")
    max_steps: int = setting(0, ge=0, doc="stop with a checkpoint after N optimizer steps (0: no limit)")
    progress: bool = setting(True, doc="progress bar")
    threads: int = setting(0, ge=0, doc="torch threads (0: leave as is)")
    tensorboard: bool = setting(True, doc="TensorBoard events when tensorboard is installed")

    def check(self) -> None:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"train.device={self.device!r}: expected auto, cpu, cuda or cuda:N")
        out = pathlib.Path(self.output)
        if out.exists() and not out.is_dir():
            raise ValueError(f"train.output={self.output!r} is a file: expected a folder for the run's outputs")


SECTIONS: dict[str, type] = {
    "model": ModelCfg,
    "data": DataCfg,
    "aug": AugCfg,
    "optim": OptimCfg,
    "sched": SchedCfg,
    "train": TrainCfg,
}
_FREEFORM = {("model", "kwargs")}


@dataclass
class Config:
    """A whole training config; ``Config()`` holds the defaults."""

    model: ModelCfg = field(default_factory=ModelCfg)
    data: DataCfg = field(default_factory=DataCfg)
    aug: AugCfg = field(default_factory=AugCfg)
    optim: OptimCfg = field(default_factory=OptimCfg)
    sched: SchedCfg = field(default_factory=SchedCfg)
    train: TrainCfg = field(default_factory=TrainCfg)

    @classmethod
    def from_dict(cls, data: Optional[dict]) -> "Config":
        """Defaults updated by a (partial) nested dict; every value checked (ValueError naming the key)."""
        data = data or {}
        if not isinstance(data, dict):
            raise ValueError(f"a config must be a mapping of sections, got {type(data).__name__}")
        for name in data:
            if name not in SECTIONS:
                raise ValueError(f"unknown config section {name!r}{_suggest(str(name), SECTIONS)}")
        return cls(**{name: _section(name, sec, data.get(name)) for name, sec in SECTIONS.items()})

    def to_dict(self) -> dict:
        """Plain nested dict (lists, not tuples), as written to ``config.yaml``."""
        return {
            name: {f.name: _plain(getattr(getattr(self, name), f.name)) for f in dataclasses.fields(sec)}
            for name, sec in SECTIONS.items()
        }

    def get(self, key: str) -> Any:
        """The value at a dotted key (``"optim.lr"``)."""
        section, _, name = key.partition(".")
        return getattr(getattr(self, section), name)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _suggest(key: str, options: Iterable[str]) -> str:
    options = list(options)
    close = difflib.get_close_matches(key, options, n=3)
    return f" (did you mean {', '.join(close)}?)" if close else f" (known: {', '.join(sorted(options))})"


def fields_of(section: type) -> list[tuple[dataclasses.Field, Any]]:
    """``(field, type)`` of a section's settings, types resolved."""
    hints = typing.get_type_hints(section)
    return [(f, hints[f.name]) for f in dataclasses.fields(section)]


def _section(name: str, section: type, values: Any):
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ValueError(f"config key {name!r} is a section: expected a mapping of its keys, got {values!r}")
    known = {f.name: (f, tp) for f, tp in fields_of(section)}
    for key in values:
        if key not in known:
            raise ValueError(f"unknown config key '{name}.{key}'{_suggest(str(key), known)}")
    kwargs = {
        key: _convert(f"{name}.{key}", values[key], tp, f.metadata) for key, (f, tp) in known.items() if key in values
    }
    cfg = section(**kwargs)
    if hasattr(cfg, "check"):
        cfg.check()
    return cfg


class _WrongType(ValueError):
    """A value of the wrong type (a range error is a plain ValueError)."""


_PLURAL = {int: "integers", float: "numbers", bool: "booleans", str: "strings"}


def _describe(tp) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(_describe(a) for a in inner) + " or null"
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_PLURAL[args[0]]}"
        return f"a list of {len(args)} {_PLURAL[args[0]]}"
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a non-empty string", dict: "a mapping"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _convert(key: str, value: Any, tp, meta) -> Any:
    """``value`` as type ``tp`` within the field's range, else ValueError naming ``key``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    bad = _WrongType(f"{key}={value!r}: expected {_describe(tp)}")
    if origin in (Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)]
        try:
            return _convert(key, value, inner[0], meta)
        except _WrongType:
            raise bad from None
    if origin is Literal:
        if value not in args:
            raise _WrongType(f"{key}={value!r}: expected one of {', '.join(repr(a) for a in args)}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise bad
        fixed = not (len(args) == 2 and args[1] is Ellipsis)
        if fixed and len(value) != len(args):
            raise bad
        try:
            return tuple(_convert(key, v, args[0], {}) for v in value)
        except _WrongType:
            raise bad from None
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return _in_range(key, value, meta)
    if tp is float:
        if isinstance(value, str) and _SCI_FLOAT.fullmatch(value.strip()):  # YAML 1.1 reads 1e-3 as a string
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise bad
        return _in_range(key, float(value), meta)
    if tp is str:
        if not isinstance(value, str) or not value:
            raise bad
        return value
    if tp is dict:
        if not isinstance(value, dict):
            raise bad
        return dict(value)
    raise TypeError(f"config field {key} has an unsupported type {tp}")


def _in_range(key: str, value, meta) -> Any:
    checks = (
        ("ge", lambda v, b: v >= b, ">="),
        ("gt", lambda v, b: v > b, ">"),
        ("le", lambda v, b: v <= b, "<="),
        ("lt", lambda v, b: v < b, "<"),
    )
    for name, ok, sign in checks:
        bound = (meta or {}).get(name)
        if bound is not None and not ok(value, bound):
            raise ValueError(f"{key}={value!r}: must be {sign} {bound:g}")
    return value


def parse_value(text: str) -> Any:
    """A command-line value as YAML (so ``0.1``, ``true``, ``[1, 2]``, ``null`` work), with
    YAML 1.1's gap fixed: ``1e-3`` (no dot) is read as a float, not a string."""
    if _SCI_FLOAT.fullmatch(text.strip()):
        return float(text)
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:  # not YAML (e.g. an unbalanced bracket): the plain string, checked later
        return text


def set_dotted(data: dict, key: str, value: Any) -> None:
    """``data["a"]["b"] = value`` for ``key = "a.b"``, creating sections as needed (checked later)."""
    parts = key.split(".")
    if len(parts) < 2 or not all(parts):
        raise ValueError(f"config key {key!r}: expected section.key, e.g. optim.lr")
    node = data
    for i, p in enumerate(parts[:-1]):
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ValueError(f"config key {'.'.join(parts[: i + 1])!r} holds {node!r}, not a section")
    node[parts[-1]] = value


def load_config(path: Optional[PathLike] = None, overrides: Iterable[tuple[str, Any]] = ()) -> Config:
    """Defaults <- YAML file (``_base_`` chains followed) <- ``(dotted key, value)`` overrides, checked."""
    data = read_yaml(path) if path is not None else {}
    for key, value in overrides:
        set_dotted(data, key, value)
    return Config.from_dict(data)


def read_yaml(path: PathLike, _chain: tuple = ()) -> dict:
    """A YAML config as a dict, following ``_base_`` (a path relative to this file) recursively."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"config file {path} does not exist")
    if path.resolve() in _chain:
        loop = " -> ".join(str(p) for p in (*_chain, path.resolve()))
        raise ValueError(f"config file {path}: its _base_ chain loops ({loop})")
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"config file {path}: YAML syntax error{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping, got {type(data).__name__}")
    base = data.pop("_base_", None)
    if base is not None:
        if not isinstance(base, str):
            raise ValueError(f"config file {path}: _base_ must be a file name, got {base!r}")
        data = _merge(read_yaml(path.parent / base, (*_chain, path.resolve())), data)
    return data


def _merge(base: dict, update: dict) -> dict:
    """Recursive dict merge (``update`` wins); keys are checked later by :meth:`Config.from_dict`."""
    out = dict(base)
    for k, v in update.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def save_config(cfg: Config, path: PathLike) -> None:
    """Write the resolved config as YAML (floats keep a dot so YAML 1.1 reads them back as floats)."""
    atomic_write_text(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=None))


def configs_dir() -> pathlib.Path:
    """The recipes folder: ``$INLINE_ATTN_CONFIGS``, ``./configs``, the source tree's
    ``configs/``, or the copy installed with the package (``inline_attn/configs``)."""
    package = pathlib.Path(__file__).resolve().parents[1]
    cands = [os.environ.get("INLINE_ATTN_CONFIGS"), "configs", package.parents[1] / "configs", package / "configs"]
    for c in cands:
        if c and (pathlib.Path(c) / DEMO_CONFIG).is_file():
            return pathlib.Path(c)
    raise ValueError(
        "cannot find the configs/ folder: run from the repository root, set INLINE_ATTN_CONFIGS, "
        "or pass the config file explicitly"
    )


# --- resume: which settings may differ between a checkpoint's run and the run continuing it

RESUME_MAY_CHANGE = frozenset(
    {
        "data.path",
        "data.workers",
        "train.output",
        "train.resume",
        "train.progress",
        "train.tensorboard",
        "train.threads",
        "train.max_steps",
        "train.eval_every",
        "train.compile",
        "train.compile_mode",
        "train.channels_last",
    }
)
"""Settings that may change when a run is resumed: where the data and outputs are, how the run
is executed and watched, and when it stops. Everything else (model, data pipeline, batch size,
optimizer, schedule, seed, precision) shapes the training itself, so a resume refuses a change
to it."""


def resume_differences(saved: dict, current: Config) -> list[str]:
    """``"key: saved -> current"`` for every setting outside :data:`RESUME_MAY_CHANGE` that differs."""
    try:
        before = Config.from_dict(saved).to_dict()
    except ValueError as e:
        return [f"the checkpoint's config is not valid here ({e})"]
    now = current.to_dict()
    out = []
    for section, values in now.items():
        for key, value in values.items():
            dotted = f"{section}.{key}"
            if dotted not in RESUME_MAY_CHANGE and before[section][key] != value:
                out.append(f"{dotted}: {before[section][key]!r} -> {value!r}")
    return out
