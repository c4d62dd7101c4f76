"""The parts of timm's model contract that are data: ``feature_info`` with timm's ``FeatureInfo``
methods, and ``group_matcher`` (the parameter groups timm's layer-wise lr decay and progressive
unfreezing read), written from a model's levels (:class:`inline_attn.models.InLineModel`)."""

from __future__ import annotations

import re
from typing import Optional, Sequence, Union

import torch.nn as nn

Idx = Union[None, int, Sequence[int]]

#: timm's ordinal for the parameters after the last block (the final norm): ``MATCH_PREV_GROUP``
AFTER_BLOCKS = 99999


class FeatureInfo(list):
    """One dict per level (``num_chs``, ``reduction``, ``module``), as a list, with the reading
    methods of timm's ``FeatureInfo``: ``channels``, ``reduction``, ``module_name``, ``get``,
    ``get_dicts``. ``idx``: None (every level), an int, or a sequence of ints."""

    def get(self, key: str, idx: Idx = None):
        if idx is None:
            return [f[key] for f in self]
        if isinstance(idx, int):
            return self[idx][key]
        return [self[i][key] for i in idx]

    def get_dicts(self, keys: Optional[Sequence[str]] = None, idx: Idx = None):
        pick = (lambda f: dict(f)) if keys is None else (lambda f: {k: f[k] for k in keys})  # noqa: E731
        if isinstance(idx, int):
            return pick(self[idx])
        return [pick(self[i]) for i in (range(len(self)) if idx is None else idx)]

    def channels(self, idx: Idx = None):
        return self.get("num_chs", idx)

    def reduction(self, idx: Idx = None):
        return self.get("reduction", idx)

    def module_name(self, idx: Idx = None):
        return self.get("module", idx)


def _block_list(model: nn.Module, name: str) -> Optional[tuple[str, int]]:
    """(dotted name, length) of the block sequence inside level module ``name``, if it has one."""
    try:
        module = model.get_submodule(name)
    except AttributeError:  # a parameter (cls_token, pos_embed)
        return None
    for prefix, seq in ((name, module), (f"{name}.blocks", getattr(module, "blocks", None))):
        if isinstance(seq, (nn.ModuleList, nn.Sequential)) and len(seq):
            return prefix, len(seq)
    return None


def _prefix(name: str) -> str:
    """A regex matching parameter names under module or parameter ``name``."""
    return rf"^{re.escape(name)}(?:\.|$)"


def group_matcher(model, coarse: bool = False) -> dict:
    """timm's ``group_matcher``: ``{"stem": regex, "blocks": [(regex, ordinal tuple), ...]}``.

    Coarse: one group per level (DeiT's block, the other families' stage). Fine: one per block,
    ``(level, block)``; a level's modules outside its blocks (a downsampling) come before them,
    ``(level,)``; the final norm joins the last block. The entries are listed most specific first
    (timm takes the first that matches)."""
    stem = model._stem_modules()
    entries = []
    for i in range(model.num_levels):
        for name in model._level_modules(i):
            if name in stem:
                continue
            blocks = None if coarse else _block_list(model, name)
            if blocks is not None:
                seq, n = blocks
                entries += [(_prefix(f"{seq}.{j}"), (i, j)) for j in range(n)]
            entries.append((_prefix(name), (i,)))  # (i,) sorts before (i, 0): a downsampling first
    entries.sort(key=lambda e: -len(e[0]))  # more specific (longer) prefixes first
    entries.append((_prefix("norm"), (AFTER_BLOCKS,)))
    return {"stem": "|".join(_prefix(s) for s in stem), "blocks": entries}


def layer_ids(model, coarse: bool = False) -> dict[str, int]:
    """Parameter name -> its layer (0: the stem; the groups of :func:`group_matcher` in order; the
    head and anything unmatched last), the numbering timm's layer-wise lr decay uses."""
    matcher = group_matcher(model, coarse)
    stem = re.compile(matcher["stem"])
    compiled = [(re.compile(p), key) for p, key in matcher["blocks"]]
    keys = {}
    for name, _ in model.named_parameters():
        if stem.match(name):
            keys[name] = (0,)
            continue
        hit = next((key for p, key in compiled if p.match(name)), None)
        keys[name] = (1, *hit) if hit is not None else (float("inf"),)
    after = (1, AFTER_BLOCKS)  # the final norm joins the last block's layer, as in timm
    order = {k: i for i, k in enumerate(sorted(set(keys.values()) - {after}))}
    order[after] = max((i for k, i in order.items() if k[0] == 1), default=0)
    return {name: order[k] for name, k in keys.items()}
