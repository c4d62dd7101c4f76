"""The timm model contract, written once for the four families.

:class:`InLineModel` gives every family the same public methods, with the same behaviour:

=============================  ===================================================================
``forward(x)``                 logits ``[B, num_classes]``; a ``features_only`` model returns the
                               list of NCHW maps of its ``out_indices``
``forward_features(x)``        the family's final features (DeiT: tokens ``[B, 1+N, C]``; PVT: NCHW;
                               Swin: NHWC, as timm's Swin; CSwin: tokens ``[B, N, C]``)
``forward_head(x, pre_logits)`` pooled ``[B, C]`` (``pre_logits=True``) or logits
``forward_intermediates(...)`` per-level maps (``indices``, ``norm``, ``stop_early``, ``output_fmt``,
                               ``intermediates_only``, as timm)
``prune_intermediate_layers``  drops the levels, final norm and head a set of indices does not use
``feature_info``               one dict per level: ``num_chs``, ``reduction`` (stride), ``module``
                               (a list with timm's ``FeatureInfo`` methods: ``channels()``, ...)
``group_matcher(coarse)``      timm's parameter groups (stem, levels or blocks, final norm): what
                               layer-wise lr decay reads (:mod:`.timm_contract`)
``default_cfg``                ``pretrained_cfg`` under timm's older name
``reset_classifier(n, pool)``  a new head for ``n`` classes (0: none) on the model's device and dtype
``get_classifier()``           the head
``set_grad_checkpointing(on)`` recompute blocks in the backward pass (:meth:`checkpointed`)
``no_weight_decay()``          parameter names exempt from weight decay
=============================  ===================================================================

A *level* is what ``forward_intermediates`` indexes: a block for DeiT (one resolution), a stage
for PVT, Swin and CSwin. A family implements five small hooks over its own layout (state-dict
names follow the authors' code, so each family stores its levels differently):

- ``_stem(x)``: images -> the state the first level takes;
- ``_run_level(i, state)``: run level ``i`` (its downsampling included) -> the next state;
- ``_level_map(i, state, norm)``: the state after level ``i`` as a map in ``_map_fmt`` layout;
- ``_final(state, i)``: ``forward_features``' output from the state after level ``i``;
- ``_pool(x)``: ``forward_features``' output -> ``[B, C]``;
- ``_level_modules(i)``: the dotted names of the modules and parameters only level ``i`` uses;
- ``_stem_modules()``: the same for the stem.

Facts a dense-prediction adapter (:class:`inline_attn.dense.DenseBackbone`) needs are stated here
too, so that it names no family: :meth:`InLineModel.stage_prefixes` (what ``frozen_stages``
freezes), :attr:`InLineModel.single_scale` (a plain ViT: one stride, a feature pyramid is built
from its last map) and :attr:`InLineModel.dense_out_norms` (a LayerNorm on each returned map).

``features_only`` is not a constructor argument: :func:`inline_attn.create_model` builds the full
model, loads a checkpoint into it, then calls :meth:`InLineModel.to_features_only` (timm's builder
does the same). Pruned names are kept in ``pruned_modules`` so that
:func:`inline_attn.load_checkpoint` can still load a full checkpoint into a pruned model.
"""

from __future__ import annotations

import fnmatch
import pathlib
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from ..layers import attention_layers, init_weights_
from ..ops.dispatch import check_impl
from ._helpers import take_indices
from .timm_contract import FeatureInfo, group_matcher

__all__ = ["OUTPUT_FORMATS", "InLineModel"]

OUTPUT_FORMATS = ("NCHW", "NHWC")
Indices = Union[None, int, Sequence[int]]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class InLineModel(nn.Module):
    """Base of the four model families: the contract above, over the family's five hooks.

    A family's ``__init__`` calls ``super().__init__()``, builds its modules (``norm`` and
    ``head`` always exist, ``nn.Identity`` where the family has none), sets ``num_classes``,
    ``num_features``, ``global_pool`` and ends with :meth:`init_contract` (``feature_info``).
    """

    #: the pooling modes ``global_pool`` may take (the first is the default)
    global_pools: tuple[str, ...] = ("avg",)
    #: leaf names (fnmatch patterns) of the parameters exempt from weight decay
    no_weight_decay_patterns: tuple[str, ...] = ()
    #: layout of the maps ``_level_map`` returns
    _map_fmt: str = "NCHW"
    #: every level has one stride (a plain ViT): dense prediction builds a pyramid from the last map
    single_scale: bool = False
    #: dense prediction adds a LayerNorm on each returned map, as the family's own detection /
    #: segmentation code does
    dense_out_norms: bool = False

    def __init_subclass__(cls, **kwargs):
        # torch.compile keys its automatic-dynamic-shape state on the compiled frame's code
        # (file, line, name): a ``forward`` shared by the families would make the second family
        # compiled in a process look like a shape change of the first, and it would be recompiled
        # with dynamic shapes (minutes for Swin's windowing). So each family writes a one-line
        # ``forward`` of its own that calls :meth:`_forward`.
        super().__init_subclass__(**kwargs)
        if "forward" not in cls.__dict__:
            raise TypeError(
                f"{cls.__name__} must define forward(x) as `return self._forward(x)` "
                "(one torch.compile frame per model class)"
            )

    def __init__(self) -> None:
        super().__init__()
        self.grad_checkpointing = False
        self.features_only = False
        self.out_indices: Optional[tuple[int, ...]] = None
        self.pruned_modules: tuple[str, ...] = ()
        self.feature_info: FeatureInfo = FeatureInfo()
        self._built_levels = 0
        self._num_levels = 0

    def init_contract(self, feature_info: list[dict[str, Any]]) -> None:
        """Record the levels the family built (one ``feature_info`` dict per level)."""
        if self.global_pool not in self.global_pools:
            raise ValueError(f"global_pool={self.global_pool!r}: expected one of {self.global_pools}")
        self.feature_info = FeatureInfo(feature_info)
        self._built_levels = self._num_levels = len(feature_info)

    @property
    def num_levels(self) -> int:
        """Levels this model holds (fewer than built after pruning)."""
        return self._num_levels

    # ---- the family's hooks

    def _stem(self, x: torch.Tensor):
        raise NotImplementedError

    def _run_level(self, i: int, state):
        raise NotImplementedError

    def _level_map(self, i: int, state, norm: bool) -> torch.Tensor:
        raise NotImplementedError

    def _final(self, state, i: int) -> torch.Tensor:
        raise NotImplementedError

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _level_modules(self, i: int) -> list[str]:
        raise NotImplementedError

    def _stem_modules(self) -> list[str]:
        raise NotImplementedError

    def stage_prefixes(self, num_stages: int = 4) -> tuple[list[str], list[list[str]]]:
        """Parameter-name prefixes of the stem and of each stage, for freezing the first stages.

        Returns (stem prefixes, [prefixes of stage 0, ..., stage ``num_stages - 1``]); a module's
        prefix ends with ``"."``, a parameter's is its name. A stage is a level here: the modules
        of :meth:`_level_modules` that the stem does not use, its downsampling of the stage input
        included (Swin's patch merging ends the previous stage, ``layers.{i-1}.downsample``, so
        freezing the first k stages freezes ``layers.0`` .. ``layers.{k-1}`` whole, as Swin's own
        code). DeiT splits its blocks into ``num_stages`` equal groups.
        """
        stem = self._stem_modules()
        params = dict(self.named_parameters())

        def prefix(name: str) -> str:
            return name if name in params else name + "."

        stages = [[prefix(n) for n in self._level_modules(i) if n not in stem] for i in range(num_stages)]
        return [prefix(n) for n in stem], stages

    # ---- forward

    def checkpointed(self, module: nn.Module, *args):
        """``module(*args)``, recomputed in the backward pass when gradient checkpointing is on
        (and never while scripting, where checkpoint is unsupported)."""
        if self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
            return checkpoint(module, *args, use_reentrant=False)
        return module(*args)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images [B, C_in, H, W] -> the family's final features (see the module docstring)."""
        state = self._stem(x)
        for i in range(self._num_levels):
            state = self._run_level(i, state)
        return self._final(state, self._num_levels - 1)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """``forward_features``' output -> logits [B, num_classes] (pooled [B, C] with pre_logits)."""
        x = self._pool(x)
        return x if pre_logits else self.head(x)

    def _forward(self, x: torch.Tensor):
        """What every family's ``forward`` does: logits, or the maps of a features_only model."""
        if self.features_only:
            return self.forward_intermediates(x, self.out_indices, intermediates_only=True)
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: Indices = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ):
        """Per-level feature maps.

        Args:
            x: images [B, C_in, H, W].
            indices: levels to return: None = all, an int n = the last n, or a sequence
                (negative counts from the end).
            norm: apply the final norm to the returned maps where it applies (DeiT: every block,
                all of one width; Swin and CSwin: the last stage only; PVT has no final norm).
            stop_early: stop after the last requested level (the first return value is then
                that level's output).
            output_fmt: "NCHW" ([B, C_i, H_i, W_i]) or "NHWC".
            intermediates_only: return only the maps.
        Returns:
            the list of maps, or (``forward_features``' output, the list of maps).
        """
        if output_fmt not in OUTPUT_FORMATS:
            raise ValueError(f"output_fmt={output_fmt!r}: expected one of {OUTPUT_FORMATS}")
        take = take_indices(self._num_levels, indices)
        last = take[-1] if stop_early or intermediates_only else self._num_levels - 1
        state = self._stem(x)
        maps = []
        for i in range(last + 1):
            state = self._run_level(i, state)
            if i in take:
                maps.append(self._to_format(self._level_map(i, state, norm), output_fmt))
        if intermediates_only:
            return maps
        return self._final(state, last), maps

    def _to_format(self, fmap: torch.Tensor, output_fmt: str) -> torch.Tensor:
        if output_fmt == self._map_fmt:
            return fmap
        order = (0, 3, 1, 2) if output_fmt == "NCHW" else (0, 2, 3, 1)
        return fmap.permute(*order).contiguous()

    # ---- pruning and features_only

    def _remove(self, name: str) -> None:
        """Remove the module or parameter ``name`` (dotted): the last entry of a ModuleList is
        deleted, anything else becomes None (as an absent optional module)."""
        parent_name, _, leaf = name.rpartition(".")
        parent = self.get_submodule(parent_name) if parent_name else self
        if isinstance(parent, nn.ModuleList) and leaf.isdigit():
            if int(leaf) != len(parent) - 1:
                raise ValueError(f"can only prune the last entry of {parent_name!r}, not {name!r}")
            del parent[int(leaf)]
        elif leaf in parent._modules or leaf in parent._parameters:
            setattr(parent, leaf, None)
        else:
            raise ValueError(f"{type(self).__name__} has no module or parameter {name!r} to prune")
        self.pruned_modules += (name,)

    def prune_intermediate_layers(
        self, indices: Indices = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop what ``forward_intermediates(indices)`` does not use; returns the kept indices.

        Levels after the last index go; ``prune_norm`` replaces the final norm and
        ``prune_head`` the head by ``nn.Identity`` (``num_classes`` becomes 0).
        """
        take = take_indices(self._num_levels, indices)
        keep = take[-1] + 1
        for i in reversed(range(keep, self._num_levels)):
            for name in self._level_modules(i):
                self._remove(name)
        self._num_levels = keep
        self.feature_info = FeatureInfo(self.feature_info[:keep])
        if prune_norm and not isinstance(self.norm, nn.Identity):
            self.norm = nn.Identity()
            self.pruned_modules += ("norm",)
        if prune_head:
            if not isinstance(self.head, nn.Identity):
                self.pruned_modules += ("head",)
            self.head = nn.Identity()
            self.num_classes = 0
        return take

    def to_features_only(self, out_indices: Indices = None) -> "InLineModel":
        """Make this model a feature backbone, in place: ``forward`` returns the NCHW maps of
        ``out_indices`` (None = every level; an int n = the last n; or a sequence), and the
        levels after the last of them, the final norm and the head are pruned. Returns self."""
        if self.features_only:
            raise ValueError("the model is features_only already")
        take = self.prune_intermediate_layers(out_indices, prune_norm=True, prune_head=True)
        self.features_only = True
        self.out_indices = tuple(take)
        self.feature_info = FeatureInfo(self.feature_info[i] for i in take)
        return self

    # ---- a model as a folder (config.json + model.safetensors: inline_attn.models.pretrained)

    def save_pretrained(self, save_directory) -> pathlib.Path:
        """Write this model to ``save_directory``: :func:`inline_attn.models.pretrained.save_pretrained`."""
        from .pretrained import save_pretrained

        return save_pretrained(self, save_directory)

    @classmethod
    def from_pretrained(cls, folder, **kwargs) -> "InLineModel":
        """The model a ``save_pretrained`` folder holds (:func:`inline_attn.models.pretrained.from_pretrained`,
        ``device`` and ``dtype`` keywords); called on a family class, the folder must hold that family."""
        from .pretrained import from_pretrained

        model = from_pretrained(folder, **kwargs)
        if not isinstance(model, cls):
            raise ValueError(f"{cls.__name__}.from_pretrained: {str(folder)!r} holds a {type(model).__name__}")
        return model

    # ---- classifier, weight decay, checkpointing

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """A fresh head for ``num_classes`` (0: ``nn.Identity``), initialised as the model's own
        linear layers, on the device and in the dtype of the model's parameters; ``global_pool``
        (None keeps it) must be one of :attr:`global_pools`."""
        if self.features_only:
            raise ValueError(f"a features_only {type(self).__name__} has no classifier to reset")
        if not (_is_int(num_classes) and num_classes >= 0):
            raise ValueError(f"num_classes={num_classes!r}: expected an integer >= 0 (0: no classifier head)")
        if global_pool is not None:
            if global_pool not in self.global_pools:
                raise ValueError(f"global_pool={global_pool!r}: expected one of {self.global_pools}")
            self.global_pool = global_pool
        self.num_classes = num_classes
        if num_classes == 0:
            self.head = nn.Identity()
            return
        ref = next(self.parameters())
        self.head = nn.Linear(self.num_features, num_classes, device=ref.device, dtype=ref.dtype)
        init_weights_(self.head)

    def set_impl(self, impl: Optional[str]) -> None:
        """Set the implementation of every attention layer (their ``impl``): one of
        :data:`inline_attn.ops.IMPLS`, or None for the process default (:func:`inline_attn.ops.use_impl`).
        The families' ``impl`` argument and ``create_model(name, impl=...)`` come here."""
        if impl is not None:
            check_impl(impl)
        for _, layer in attention_layers(self):
            layer.impl = impl

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        """timm's parameter groups: :func:`inline_attn.models.timm_contract.group_matcher`."""
        return group_matcher(self, coarse)

    @property
    def default_cfg(self):
        """``pretrained_cfg`` (timm's older name; timm's builder assigns both)."""
        return getattr(self, "pretrained_cfg", None)

    @default_cfg.setter
    def default_cfg(self, cfg) -> None:
        self.pretrained_cfg = cfg

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = bool(enable)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Names of the parameters whose leaf name matches :attr:`no_weight_decay_patterns`
        (position embeddings, the cls token, relative position tables)."""
        return {
            n
            for n, _ in self.named_parameters()
            if any(fnmatch.fnmatchcase(n.rsplit(".", 1)[-1], p) for p in self.no_weight_decay_patterns)
        }
