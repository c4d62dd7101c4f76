"""One factory over a registry of model variants (timm's pattern).

Each family module declares its variants in one table: a :class:`Family` (the class and what
all its variants share) and one :meth:`Family.variant` line per variant with its constructor
defaults and the paper's numbers, which registers a factory ``inline_<family>_<size>(**overrides)``
with its :class:`ModelConfig` (timm's ``@register_model`` functions, written once).
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Optional, Sequence, Union

import torch.nn as nn

from .args import check_model_args

IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ModelConfig:
    """Per-variant facts: how to feed the model and what the paper reports for it."""

    name: str
    family: str
    input_size: tuple[int, int, int] = (3, 224, 224)
    crop_pct: float = 0.875
    interpolation: str = "bicubic"
    mean: tuple[float, ...] = IMAGENET_DEFAULT_MEAN
    std: tuple[float, ...] = IMAGENET_DEFAULT_STD
    num_classes: int = 1000
    classifier: str = "head"
    first_conv: str = "patch_embed.proj"
    paper_top1: Optional[float] = None
    num_params: Optional[int] = None
    macs_g: Optional[float] = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    # read as a mapping, as timm reads a model's pretrained_cfg (resolve_model_data_config calls .get,
    # its hub export .items()); "architecture" is timm's name for ``name``
    def get(self, key: str, default=None):
        return self[key] if key in self else default

    def __getitem__(self, key: str):
        if key == "architecture":
            return self.name
        if key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key) -> bool:
        return key == "architecture" or key in self.__dataclass_fields__

    def keys(self):
        return ["architecture", *self.__dataclass_fields__]

    def items(self):
        return [(k, self[k]) for k in self.keys()]


def variant_config(
    name: str,
    family: str,
    defaults: dict,
    *,
    reference: str,
    first_conv: str,
    recorded: Sequence[str] = ("pattern", "drop_path_rate"),
    crop_pct: float = 0.875,
    **facts,
) -> ModelConfig:
    """The :class:`ModelConfig` of a registered variant built from its constructor ``defaults``:
    a square input of ``defaults["img_size"]`` (224 when absent) and the authors' evaluation
    pipeline otherwise (bicubic, ImageNet mean / std, ``crop_pct``); ``extra`` records the
    reference class and the ``recorded`` defaults that define the variant; ``facts`` are the
    paper's numbers (``paper_top1``, ``num_params``, ``macs_g``)."""
    size = defaults.get("img_size", 224)
    return ModelConfig(
        name=name,
        family=family,
        input_size=(3, size, size),
        crop_pct=crop_pct,
        first_conv=first_conv,
        extra=dict(reference=reference, **{k: defaults[k] for k in recorded}),
        **facts,
    )


_REGISTRY: dict[str, tuple[Callable[..., nn.Module], ModelConfig]] = {}


def register_model(cfg: ModelConfig):
    """Decorator: register ``fn(**overrides) -> nn.Module`` under ``cfg.name``."""

    def wrap(fn: Callable[..., nn.Module]):
        if cfg.name in _REGISTRY:
            raise ValueError(f"model {cfg.name!r} is registered twice")
        _REGISTRY[cfg.name] = (fn, cfg)
        return fn

    return wrap


@dataclass(frozen=True)
class Family:
    """What a model family's variants share: the model class, the family's name, the reference
    class (``extra["reference"]``), the stem convolution (``first_conv``), the constructor defaults
    that define a variant (``recorded`` in ``extra``) and the authors' evaluation crop."""

    cls: type
    name: str
    reference: str
    first_conv: str
    recorded: tuple[str, ...] = ("pattern", "drop_path_rate")
    crop_pct: float = 0.875

    def variant(
        self,
        size: str,
        title: str,
        defaults: dict,
        paper_top1: Optional[float],
        num_params: Optional[int],
        macs_g: Optional[float],
        *,
        crop_pct: Optional[float] = None,
    ) -> Callable[..., nn.Module]:
        """Register ``inline_<family>_<size>``, which builds ``cls(**{**defaults, **overrides})``,
        with its :class:`ModelConfig` (:func:`variant_config`; ``crop_pct`` None: the family's) and
        the paper's top-1 (%), parameter count and GMACs. Returns the factory, which the family
        module keeps under its registered name."""
        name = f"inline_{self.name}_{size}"
        cfg = variant_config(
            name,
            self.name,
            defaults,
            reference=self.reference,
            first_conv=self.first_conv,
            recorded=self.recorded,
            crop_pct=self.crop_pct if crop_pct is None else crop_pct,
            paper_top1=paper_top1,
            num_params=num_params,
            macs_g=macs_g,
        )

        def factory(**overrides) -> nn.Module:
            return self.cls(**{**defaults, **overrides})

        factory.__name__ = factory.__qualname__ = name
        factory.model_cls = self.cls  # whose constructor's annotations type the overrides (check_model_args)
        factory.__module__ = self.cls.__module__
        args = ", ".join(f"{k}={v!r}" for k, v in defaults.items())
        factory.__doc__ = f"{title}: {args} (``overrides`` replace any constructor argument)."
        return register_model(cfg)(factory)


def _lookup(name: str):
    if not isinstance(name, str):
        raise ValueError(f"model name {name!r}: expected a registered model's name, a string (see list_models())")
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=3)
        hint = f"; did you mean {close}?" if close else f"; known models: {sorted(_REGISTRY)}"
        raise ValueError(f"unknown model {name!r}{hint}")
    return _REGISTRY[name]


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching an fnmatch ``pattern``, sorted."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatchcase(n, pattern))


def model_table(names: Sequence[str]) -> str:
    """One line per model: input size, parameters, GMACs and the paper's top-1 ("-" where unknown)."""
    lines = [f"{'model':26s} {'input':>5s} {'params':>12s} {'GMACs':>7s} {'top-1':>6s}"]
    for n in names:
        c = get_model_config(n)
        params = f"{c.num_params:,}" if c.num_params else "-"
        macs = f"{c.macs_g:.2f}" if c.macs_g else "-"
        top1 = f"{c.paper_top1:.1f}" if c.paper_top1 else "-"
        lines.append(f"{n:26s} {c.input_size[-1]:5d} {params:>12s} {macs:>7s} {top1:>6s}")
    return "\n".join(lines)


def get_model_config(name: str) -> ModelConfig:
    """The :class:`ModelConfig` of a registered model."""
    return _lookup(name)[1]


# overrides that change how a model trains or computes, not the network it is: the paper's numbers still hold
_TRAINING_ONLY = frozenset({"drop_rate", "drop_path_rate", "attn_drop_rate", "impl"})


def described_config(cfg: ModelConfig, overrides: dict) -> ModelConfig:
    """The :class:`ModelConfig` of a model built with ``overrides``: the variant's own without them;
    otherwise its class count, input size and recorded arguments follow the overrides, and the
    paper's numbers (top-1, parameters, MACs), which describe the published network, are dropped
    unless every override only changes training (drop rates, ``impl``)."""
    if not overrides:
        return cfg
    size = overrides.get("img_size", cfg.input_size[1:])
    sides = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
    changes = dict(
        num_classes=overrides.get("num_classes", cfg.num_classes),
        input_size=(overrides.get("in_chans", cfg.input_size[0]), *sides),
        extra={**cfg.extra, **{k: v for k, v in overrides.items() if k in cfg.extra}},
    )
    if not set(overrides) <= _TRAINING_ONLY:
        changes.update(paper_top1=None, num_params=None, macs_g=None)
    return replace(cfg, **changes)


def _load_pretrained(model: nn.Module, cfg: ModelConfig, pretrained) -> None:
    """Load ``pretrained`` (True: the authors' published file; a path or URL) into ``model``, strictly,
    except the classifier when the model's class count differs from the variant's."""
    from .checkpoint import load_checkpoint, read_state_dict
    from .weights import published_url, weights_file

    if pretrained is True:
        source = published_url(cfg.name)
    elif isinstance(pretrained, (str, os.PathLike)):
        source = pretrained
    else:
        raise ValueError(
            f"create_model({cfg.name!r}, pretrained={pretrained!r}): expected True, False, or a checkpoint path or URL"
        )
    path = weights_file(source, model_name=cfg.name)
    if getattr(model, "num_classes", cfg.num_classes) == cfg.num_classes:
        load_checkpoint(model, path, strict=True)
        return
    # a new classifier (fine-tuning): its fresh weights stay, every other weight must fit
    head = cfg.classifier + "."
    state = {k: v for k, v in read_state_dict(path).items() if not k.startswith(head)}
    result = load_checkpoint(model, state, strict=False)
    result.missing = [k for k in result.missing if not k.startswith(head)]
    if not result.ok:
        raise ValueError(f"pretrained weights {str(path)!r} do not fit {cfg.name!r}: {result.describe()}")


def create_model(
    name: str,
    *,
    pretrained: Union[bool, str, os.PathLike] = False,
    checkpoint_path: Optional[str] = None,
    features_only: bool = False,
    out_indices=None,
    **overrides,
) -> nn.Module:
    """Build a registered model; ``overrides`` replace the variant's constructor arguments.

    ``pretrained=True`` loads the authors' released ImageNet-1k weights, downloaded once into
    torch.hub's cache (:mod:`inline_attn.models.weights`); ``pretrained="PATH_OR_URL"`` loads that
    checkpoint (a URL is cached the same way). With a ``num_classes`` other than the variant's, the
    classifier is left freshly initialised (fine-tuning) and every other weight must fit.

    The model gets ``model.pretrained_cfg`` (a :class:`ModelConfig`: the variant's, or what
    :func:`described_config` makes of it for a customised model) and ``model.model_args`` (the
    overrides, what :func:`inline_attn.save_pretrained` records). With ``checkpoint_path``,
    weights are loaded strictly through :func:`inline_attn.load_checkpoint`. With
    ``features_only`` the model becomes a feature backbone after the checkpoint is loaded into the
    full model (as timm's builder does): ``forward`` returns the NCHW maps of ``out_indices``
    (None = every level, an int n = the last n, or a sequence; levels are DeiT's blocks and the
    other families' stages) and what those maps do not use is pruned
    (:meth:`~inline_attn.models._base.InLineModel.to_features_only`).

    ``impl`` (one of :data:`inline_attn.ops.IMPLS`) sets every attention layer's implementation
    (:meth:`~inline_attn.models._base.InLineModel.set_impl`); it is not recorded in ``model_args``.

    An argument the family does not take, a value that does not fit the constructor's annotated
    type and the argument's range (:func:`~inline_attn.models.args.check_model_args`: ``patch_size=8.0``,
    ``qkv_bias="no"``, ``attn_drop_rate=nan``), a ``features_only`` that is not a bool or
    ``out_indices`` without ``features_only`` is a ValueError naming it.
    """
    fn, cfg = _lookup(name)
    if hasattr(fn, "model_cls"):
        check_model_args(name, fn.model_cls, overrides)
    if not isinstance(features_only, bool):
        raise ValueError(f"create_model({name!r}, features_only={features_only!r}): expected true or false")
    if out_indices is not None and not features_only:
        raise ValueError(
            f"create_model({name!r}, out_indices={out_indices!r}): out_indices selects the maps "
            "of a features_only model; pass features_only=True too"
        )
    try:
        model = fn(**overrides)
    except TypeError as e:  # a model registered without a model_cls: its constructor's own refusal
        unknown = re.search(r"unexpected keyword argument '(\w+)'", str(e))
        if unknown is None:
            raise
        raise ValueError(f"model {name!r} takes no argument {unknown.group(1)!r}") from e
    model.pretrained_cfg = described_config(cfg, overrides)
    # impl says how the model computes, not what it is: a saved model does not pin it
    model.model_args = {k: v for k, v in overrides.items() if k != "impl"}
    pretrained = False if pretrained is None else pretrained
    if pretrained is not False and checkpoint_path is not None:
        raise ValueError(f"create_model({name!r}): pass pretrained= or checkpoint_path=, not both")
    if checkpoint_path is not None:
        from .checkpoint import load_checkpoint

        load_checkpoint(model, checkpoint_path, strict=True)
    if pretrained is not False:
        _load_pretrained(model, cfg, pretrained)
    if features_only:
        model.to_features_only(out_indices)
    return model
