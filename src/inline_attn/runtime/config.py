"""Typed run configs for every task: sections from dataclasses, YAML on top, overrides last.

A task's config is a :class:`TypedConfig` whose fields are sections (dataclasses); a section's
fields are settings declared with :func:`setting` (default, allowed range, help text), or nested
sections (``data.mosaic``). A config is read as a dict (a YAML file, following ``_base_:
other.yaml`` first, then ``section.key`` overrides) and converted by :meth:`TypedConfig.from_dict`,
which checks every value before any work starts: an unknown key (with did-you-mean), a wrong
type or a value out of range is a ValueError naming the key, the value and what was expected.
Settings typed ``dict`` are free-form mappings (constructor arguments).

The ``--section.key`` command-line flags are generated from the same fields
(:func:`add_override_options`, :func:`collect_overrides`), so a new setting is one field: YAML,
the command line, the saved ``config.yaml`` and the resume check pick it up.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import pathlib
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Optional, Sequence, Union

import yaml

from .._io import atomic_write_text
from .compile import COMPILE_MODES
from .optim import OPTIMIZERS

PathLike = Union[str, os.PathLike]
_SCI_FLOAT = re.compile(r"[+-]?\d+(\.\d*)?[eE][+-]?\d+")

__all__ = [
    "check_device",
    "check_distinct",
    "check_mean_std",
    "check_output",
    "TypedConfig",
    "add_override_options",
    "collect_overrides",
    "fields_of",
    "merge",
    "parse_value",
    "read_yaml",
    "set_dotted",
    "setting",
    "suggest",
]


def setting(
    default: Any = dataclasses.MISSING,
    *,
    doc: str = "",
    ge: Optional[float] = None,
    gt: Optional[float] = None,
    le: Optional[float] = None,
    lt: Optional[float] = None,
    at_most: Union[None, str, tuple[str, ...]] = None,
    finite: bool = True,
    factory: Any = dataclasses.MISSING,
    resume: bool = False,
):
    """A config field: its default, its help text, the range a number must lie in, and whether it
    may change when a run is resumed (``resume=True``: where the data and outputs are, how the run
    is executed and watched, when it stops; every other setting shapes the training, so
    :meth:`TypedConfig.differences` reports a change to it).

    ``at_most``: the dotted key of another setting this one may not exceed (``"optim.lr"``), or
    several, of which the first that is not null counts; checked on the whole config, skipped
    while either value is null. ``finite``: a number must be finite (``.inf`` is refused like
    ``.nan``) unless the field says ``finite=False``."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "resume": resume, "at_most": at_most, "finite": finite}
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def suggest(key: str, options: Iterable[str]) -> str:
    """`` (did you mean a, b?)`` for the options close to ``key``, else `` (known: ...)``."""
    options = list(options)
    close = difflib.get_close_matches(key, options, n=3)
    return f" (did you mean {', '.join(close)}?)" if close else f" (known: {', '.join(sorted(options))})"


def fields_of(section: type) -> list[tuple[dataclasses.Field, Any]]:
    """``(field, type)`` of a section's settings, types resolved."""
    hints = typing.get_type_hints(section)
    return [(f, hints[f.name]) for f in dataclasses.fields(section)]


def _is_section(tp) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _plain(value: Any) -> Any:
    """A config value as YAML writes it: sections as dicts, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def build_section(name: str, section: type, values: Any):
    """``section`` from a (partial) mapping of its keys, every value checked; ``name`` is the
    dotted path used in errors (``data.mosaic``). A null section (``optim:`` with no keys, or
    ``optim: null``) is refused: it would silently reset every key to its default."""
    if values is None:
        raise ValueError(
            f"config section {name!r} is null (a '{name}:' line with no keys under it?): give its keys, "
            "or leave the line out for the defaults"
        )
    if not isinstance(values, dict):
        raise ValueError(f"config key {name!r} is a section: expected a mapping of its keys, got {values!r}")
    known = {f.name: (f, tp) for f, tp in fields_of(section)}
    for key in values:
        if key not in known:
            raise ValueError(f"unknown config key '{name}.{key}'{suggest(str(key), known)}")
    kwargs = {
        key: _convert(f"{name}.{key}", values[key], tp, f.metadata) for key, (f, tp) in known.items() if key in values
    }
    cfg = section(**kwargs)
    if hasattr(cfg, "check"):
        cfg.check()
    return cfg


def _settings_with_meta(node: Any, prefix: str = ""):
    """``(dotted key, value, field metadata)`` of every setting under ``node``, nested sections included."""
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _settings_with_meta(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value, f.metadata


class _WrongType(ValueError):
    """A value of the wrong type (a range error is a plain ValueError)."""


_PLURAL = {int: "integers", float: "numbers", bool: "booleans", str: "strings"}


def _literal(value) -> str:
    """A choice as YAML writes it: true / false for booleans, quoted strings."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def _describe(tp) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(_literal(a) for a in args)
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
    if _is_section(tp):
        return build_section(key, tp, value)
    if origin in (Union, types.UnionType):
        if value is None:
            return None
        try:
            return _convert(key, value, [a for a in args if a is not type(None)][0], meta)
        except _WrongType:
            raise _WrongType(f"{key}={value!r}: expected {_describe(tp)}") from None
    if origin is Literal:
        # by type as well as value: 1 and 1.0 equal True, but a setting of true / false takes a boolean
        if not any(value == a and type(value) is type(a) for a in args):
            raise _WrongType(f"{key}={value!r}: expected {_describe(tp)}")
        return value
    if origin is tuple:
        return _convert_tuple(key, value, tp, args)
    return _convert_scalar(key, value, tp, meta)


def _convert_tuple(key: str, value: Any, tp, args) -> tuple:
    bad = _WrongType(f"{key}={value!r}: expected {_describe(tp)}")
    if not isinstance(value, (list, tuple)):
        raise bad
    fixed = not (len(args) == 2 and args[1] is Ellipsis)
    if fixed and len(value) != len(args):
        raise bad
    if any(isinstance(v, float) and math.isinf(v) for v in value):
        raise ValueError(f"{key}={value!r}: expected finite numbers")
    try:
        return tuple(_convert(key, v, args[0], {}) for v in value)
    except _WrongType:
        raise bad from None


def _convert_scalar(key: str, value: Any, tp, meta) -> Any:
    bad = _WrongType(f"{key}={value!r}: expected {_describe(tp)}")
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
        if math.isinf(value) and (meta or {}).get("finite", True):
            raise ValueError(f"{key}={value!r}: expected a finite number")
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


def check_mean_std(section: str, mean: Optional[tuple], std: Optional[tuple]) -> None:
    """Per-channel normalisation: non-empty, std > 0, as many values in each."""
    for key, value in (("mean", mean), ("std", std)):
        if value is not None and not value:
            raise ValueError(f"{section}.{key}=[]: expected one number per channel, or null")
    if std is not None and min(std) <= 0:
        raise ValueError(f"{section}.std={list(std)}: every value must be > 0")
    if mean is not None and std is not None and len(mean) != len(std):
        raise ValueError(f"{section}.mean has {len(mean)} channels but {section}.std {len(std)}")


def check_distinct(key: str, values: Iterable) -> None:
    """ValueError naming ``key`` when ``values`` repeat one (a seed given twice would count twice in a
    mean +- std), or are empty."""
    values = list(values)
    repeated = sorted({str(v) for v in values if values.count(v) > 1})
    if repeated:
        raise ValueError(f"{key}={values!r} repeats {', '.join(repeated)}: give each once")
    if not values:
        raise ValueError(f"{key} is empty: give at least one")


def check_device(key: str, device: str) -> None:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise ValueError(f"{key}={device!r}: expected auto, cpu, cuda or cuda:N")


def check_output(key: str, output: str) -> None:
    out = pathlib.Path(output)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{key}={output!r} is a file: expected a folder for the run's outputs")


class SharedSection:
    """A section of settings that several tasks share, each declared once here. A task's section
    subclasses it, adds its own settings and may give a shared one its own default value, as a
    class argument: ``class SegTrainCfg(RunCfg, defaults={"output": "runs/seg"})``. The setting's
    type, help and range stay the one declaration's (a default of the wrong type or range fails
    when the class is made, not when a config is read)."""

    def __init_subclass__(cls, defaults: Optional[dict] = None, **kwargs):
        super().__init_subclass__(**kwargs)
        own = dict(cls.__dict__.get("__annotations__", {}))
        for name, value in (defaults or {}).items():
            owner = next((b for b in cls.__mro__[1:] if name in getattr(b, "__dataclass_fields__", {})), None)
            if owner is None or name in own:
                raise TypeError(f"{cls.__name__}: defaults[{name!r}] names no shared setting declared once above it")
            declared, tp = owner.__dataclass_fields__[name], typing.get_type_hints(owner)[name]
            own[name] = tp
            setattr(
                cls,
                name,
                field(
                    default=_convert(f"{cls.__name__}.{name}", value, tp, declared.metadata), metadata=declared.metadata
                ),
            )
        cls.__annotations__ = own


@dataclass
class RunCfg(SharedSection):
    """The ``train`` settings every run shares, declared once; a task's ``train`` section adds its
    own (and may give ``output`` its own default: :class:`SharedSection`)."""

    output: str = setting("runs/train", doc="output folder", resume=True)
    seed: int = setting(0, ge=0, doc="random seed")
    deterministic: bool = setting(False, doc="deterministic algorithms (slower)")
    device: str = setting("auto", doc="auto | cpu | cuda | cuda:N")
    amp: Literal["none", "bf16", "fp16", "auto"] = setting(
        "none", doc="none | bf16 | fp16 (CUDA, with a GradScaler) | auto (fp16 on CUDA, none on CPU)"
    )
    resume: Optional[str] = setting(
        None, doc="null | auto (the output folder's checkpoint) | a checkpoint path", resume=True
    )
    overwrite: bool = setting(
        False,
        doc="replace a finished or interrupted run in the output folder (its files move into a subfolder)",
        resume=True,
    )
    max_steps: int = setting(
        0, ge=0, doc="stop with a checkpoint after N optimizer steps (iterations; 0: no limit)", resume=True
    )
    progress: bool = setting(True, doc="progress bar", resume=True)
    threads: int = setting(0, ge=0, doc="torch threads (0: leave as is)", resume=True)
    compile: bool = setting(
        False, doc="torch.compile the model (the fused InLine op compiles as one node)", resume=True
    )
    compile_mode: Literal[COMPILE_MODES] = setting(
        "default", doc="torch.compile mode when train.compile is on (reduce-overhead: CUDA graphs)", resume=True
    )
    cuda_graphs: Literal["auto", True, False] = setting(
        "auto",
        doc="capture the training and evaluation steps in CUDA graphs and replay them: auto (on where the run "
        "can be captured: CUDA, one process, bf16 or fp32, no accumulation, a task whose loss is computed "
        "outside the model: classification), true (asked for: a run that cannot "
        "be captured says why in one line and runs ungraphed) or false; with train.compile, inductor's "
        "reduce-overhead mode instead",
        resume=True,
    )
    channels_last: bool = setting(False, doc="channels-last images and convolutions", resume=True)
    tensorboard: bool = setting(True, doc="TensorBoard events when tensorboard is installed", resume=True)

    def check(self) -> None:
        check_device("train.device", self.device)
        check_output("train.output", self.output)


@dataclass
class OptimCfg(SharedSection):
    """The ``optim`` settings every task shares, declared once; a task's section adds its own and
    may give these its own defaults (:class:`SharedSection`)."""

    opt: Literal[OPTIMIZERS] = setting("adamw", doc="adamw | sgd (momentum 0.9, Nesterov)")
    betas: tuple[float, float] = setting((0.9, 0.999), doc="AdamW betas")
    eps: float = setting(1.0e-8, gt=0, doc="AdamW epsilon")
    lr: Optional[float] = setting(
        None,
        gt=0,
        doc="learning rate; null: the task's rule (classification: optim.base_lr x total batch / 512, with "
        "sched.warmup_lr and sched.min_lr scaled alike, which a set lr makes absolute; segmentation and "
        "detection need a value)",
    )
    weight_decay: float = setting(0.05, ge=0, doc="weight decay (not on biases, norms and position tables)")
    clip_grad: Optional[float] = setting(None, ge=0, doc="max gradient norm (null or 0: off)")

    def check(self) -> None:
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optim.betas={list(self.betas)}: each must be in [0, 1)")


@dataclass
class TypedConfig:
    """A whole config: each field a section (a dataclass of settings). Subclasses declare the
    sections; ``Subclass()`` holds the defaults."""

    @classmethod
    def sections(cls) -> dict[str, type]:
        """Section name -> its dataclass, in declaration order."""
        return {f.name: tp for f, tp in fields_of(cls)}

    @classmethod
    def from_dict(cls, data: Optional[dict]):
        """Defaults updated by a (partial) nested dict; every value checked (ValueError naming the key)."""
        data = data or {}
        if not isinstance(data, dict):
            raise ValueError(f"a config must be a mapping of sections, got {type(data).__name__}")
        sections = cls.sections()
        for name in data:
            if name not in sections:
                raise ValueError(f"unknown config section {name!r}{suggest(str(name), sections)}")
        cfg = cls(**{name: build_section(name, sec, data.get(name, {})) for name, sec in sections.items()})
        cfg.check_orderings()
        return cfg

    def check_processes(self, world_size: int) -> None:
        """Refuse settings that ``world_size`` processes cannot run (ValueError), before a run
        touches its output folder; every value a config holds alone is checked on loading."""

    def check_orderings(self) -> None:
        """Every setting declared ``at_most`` another is at most it (ValueError naming both)."""
        for key, value, meta in _settings_with_meta(self):
            bound_keys = meta.get("at_most")
            if bound_keys is None or value is None:
                continue
            bound_keys = (bound_keys,) if isinstance(bound_keys, str) else bound_keys
            bound_key = next((k for k in bound_keys if self.get(k) is not None), None)
            if bound_key is not None and value > self.get(bound_key):
                raise ValueError(
                    f"{key}={value!r} exceeds {bound_key}={self.get(bound_key)!r}: expected {key} <= {bound_key}"
                )

    @classmethod
    def load(cls, path: Optional[PathLike] = None, overrides: Iterable[tuple[str, Any]] = ()):
        """Defaults <- YAML file (``_base_`` chains followed) <- ``(dotted key, value)`` overrides, checked;
        an override's mapping merges into the mapping it is given to (:func:`set_dotted`)."""
        data = read_yaml(path) if path is not None else {}
        for key, value in overrides:
            set_dotted(data, key, value, merge_mappings=True)
        return cls.from_dict(data)

    def to_dict(self) -> dict:
        """Plain nested dict (lists, not tuples), as written to ``config.yaml``."""
        return {name: _plain(getattr(self, name)) for name in self.sections()}

    def get(self, key: str) -> Any:
        """The value at a dotted key (``"optim.lr"``, ``"data.mosaic.size"``)."""
        node = self
        for part in key.split("."):
            node = getattr(node, part)
        return node

    def replace(self, **changes: Any):
        """A checked copy with dotted keys changed (``cfg.replace(**{"model.checkpoint": None})``);
        a mapping replaces the key's mapping whole."""
        data = self.to_dict()
        for key, value in changes.items():
            set_dotted(data, key, value)
        return type(self).from_dict(data)

    def save(self, path: PathLike) -> None:
        """Write the resolved config as YAML (floats keep a dot so YAML 1.1 reads them back as floats)."""
        atomic_write_text(path, yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None))

    def differences(self, saved: dict) -> list[str]:
        """``"key: saved -> current"`` for every setting that shapes the training (not declared
        ``resume=True``) and differs from the ``saved`` config dict (a checkpoint's)."""
        try:
            before = type(self).from_dict(saved)
        except ValueError as e:
            return [f"the checkpoint's config is not valid here ({e})"]
        out = []
        for key, f, *_ in setting_flags(type(self)):
            old, new = _plain(before.get(key)), _plain(self.get(key))
            if not f.metadata.get("resume") and old != new:
                out.append(f"{key}: {old!r} -> {new!r}")
        return out


# --- reading: YAML files with _base_, command-line values, dotted keys


def parse_value(text: str) -> Any:
    """A command-line value as YAML (so ``0.1``, ``true``, ``[1, 2]``, ``null`` work), with
    YAML 1.1's gap fixed: ``1e-3`` (no dot) is read as a float, not a string."""
    if _SCI_FLOAT.fullmatch(text.strip()):
        return float(text)
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:  # not YAML (e.g. an unbalanced bracket): the plain string, checked later
        return text


def set_dotted(data: dict, key: str, value: Any, *, merge_mappings: bool = False) -> None:
    """``data["a"]["b"] = value`` for ``key = "a.b"``, creating sections as needed (checked later).
    ``merge_mappings`` (the command line's overrides): a mapping given to a key that holds a mapping
    (a nested section, or a free-form setting such as ``model.kwargs``) merges into it key by key, as
    a YAML file merges over its ``_base_``: ``--model.kwargs '{depth: 4}'`` changes ``depth`` and
    keeps the config's other arguments. Without it the value replaces the mapping whole."""
    parts = key.split(".")
    if len(parts) < 2 or not all(parts):
        raise ValueError(f"config key {key!r}: expected section.key, e.g. optim.lr")
    node = data
    for i, p in enumerate(parts[:-1]):
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ValueError(f"config key {'.'.join(parts[: i + 1])!r} holds {node!r}, not a section")
    last = parts[-1]
    merging = merge_mappings and isinstance(value, dict) and isinstance(node.get(last), dict)
    node[last] = merge(node[last], value) if merging else value


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last one
    silently: a duplicated ``optim:`` section would replace the first)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"the key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


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
            data = yaml.load(f, Loader=_UniqueKeyLoader) or {}
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
        data = merge(read_yaml(path.parent / base, (*_chain, path.resolve())), data)
    return data


def merge(base: dict, update: dict) -> dict:
    """Recursive dict merge (``update`` wins); keys are checked later by :meth:`TypedConfig.from_dict`."""
    out = dict(base)
    for k, v in update.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# --- the command line: one --section.key flag per setting


def setting_flags(config: type, prefix: str = "") -> list[tuple[str, dataclasses.Field, Any, Any]]:
    """``(dotted key, field, type, default)`` of every setting of a config class or section,
    nested sections flattened."""
    out = []
    defaults = config()
    for f, tp in fields_of(config):
        key, default = f"{prefix}{f.name}", getattr(defaults, f.name)
        if _is_section(tp):
            out += setting_flags(tp, key + ".")
        else:
            out.append((key, f, tp, default))
    return out


def add_override_options(
    p: argparse.ArgumentParser, config: type[TypedConfig], example: str, sections: Optional[Sequence[str]] = None
) -> None:
    """A ``--section.key VALUE`` flag for every setting of ``config`` (help: its doc and
    default), or only of ``sections`` (section names or whole keys: a command that reads only
    those lists only them), and a repeatable ``--set KEY=VALUE`` for any key (``example``: a key for its help)."""
    g = p.add_argument_group("config overrides (YAML values: numbers, true/false, null, [lists])")
    for key, f, tp, default in setting_flags(config):
        if sections is not None and key.split(".")[0] not in sections and key not in sections:
            continue
        doc = f.metadata.get("doc", "")
        if tp is dict:
            text = f"{doc}; merges into the config's mapping key by key (default: {_plain(default)!r})"
            g.add_argument(f"--{key}", dest=f"ov:{key}", metavar="MAPPING", help=text.replace("%", "%%"))
        else:
            text = f"{doc} (default: {_plain(default)!r})" if doc else f"default: {_plain(default)!r}"
            g.add_argument(f"--{key}", dest=f"ov:{key}", metavar="V", help=text.replace("%", "%%"))
    g.add_argument(
        "--set",
        dest="ov_set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"any dotted key, e.g. --set {example} (repeatable; a mapping merges into a mapping key by key)",
    )


def run_options(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """A training command's ``--resume`` and ``--overwrite`` flags as config overrides
    (``train.resume``, ``train.overwrite``), the ones given. These flags and ``--output`` name
    ``train.*`` settings that the ``--train.*`` and ``--set`` flags name too: the same setting given
    two values on one command line (``--output A --train.output B``) is a ValueError naming both."""
    pairs = (("train.resume", args.resume), ("train.overwrite", True if args.overwrite else None))
    given = [(key, value) for key, value in pairs if value]
    output = getattr(args, "output", None)
    refuse_conflicts(collect_overrides(args) + given + ([("train.output", output)] if output else []))
    return given


_FLAG_OF = {"train.output": "--output", "train.resume": "--resume", "train.overwrite": "--overwrite"}


def refuse_conflicts(overrides: Iterable[tuple[str, Any]]) -> None:
    """ValueError when one key of ``overrides`` (a command line's) is given two different values."""
    seen: dict[str, Any] = {}
    for key, value in overrides:
        if key in seen and seen[key] != value:
            alias = f" ({_FLAG_OF[key]} is --{key})" if key in _FLAG_OF else ""
            raise ValueError(f"{key} is given two values, {seen[key]!r} and {value!r}{alias}: give it once")
        seen[key] = value


def collect_overrides(args: argparse.Namespace, mappings: Iterable[str] = ()) -> list[tuple[str, Any]]:
    """``(dotted key, value)`` of the ``--section.key`` and ``--set`` flags given, values parsed as
    YAML; a key in ``mappings`` (a free-form setting) must get a YAML mapping."""
    out = []
    mappings = set(mappings)
    for k, v in vars(args).items():
        if k.startswith("ov:") and v is not None:
            val = parse_value(v)
            if k[3:] in mappings and not isinstance(val, dict):
                raise ValueError(f"--{k[3:]} expects a YAML mapping such as '{{depth: 4}}', got {v!r}")
            out.append((k[3:], val))
    for item in getattr(args, "ov_set", []):
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        out.append((k, parse_value(v)))
    refuse_conflicts(out)
    return out
