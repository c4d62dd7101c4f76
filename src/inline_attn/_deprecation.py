"""Old names kept working: phi (the feature map) was called ``kernel`` until issue 24.

- :func:`feature_map_alias`: a decorator letting a function or ``__init__`` still take ``kernel=``,
  mapped to ``feature_map=`` with a ``FutureWarning`` (both given: a ``ValueError``);
  :func:`map_old_keyword` is the same mapping on a ``**kwargs`` dict.
- :func:`upgrade_model_kwargs`: a stored mapping of model arguments (a run's ``config.yaml``, a
  checkpoint's ``model_kwargs``, a ``config.json``) with ``kernel`` renamed, silently: a file
  written before the rename loads to the same model.
- :func:`renamed_state_keys`: the same for state-dict keys (a learnable feature map's parameters
  were stored under ``kernel.``).
- :func:`renamed_attributes`: a module ``__getattr__`` serving old module-level names with a
  ``FutureWarning``.

Importable from every floor (a root module, like ``_io``).
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
import warnings
from typing import Any, Callable, Collection, Iterable, TypeVar

OLD, NEW = "kernel", "feature_map"
_OLD_SEGMENT = re.compile(r"(^|\.)" + OLD + r"\.")
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep

F = TypeVar("F", bound=Callable[..., Any])


def warn_renamed(message: str) -> None:
    """A ``FutureWarning`` attributed to the first caller outside this package."""
    level, frame = 1, sys._getframe(0)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, FutureWarning, stacklevel=level)


def map_old_keyword(kwargs: dict, where: str = "", positional: Any = None) -> dict:
    """``kwargs`` with a deprecated ``kernel`` moved to ``feature_map`` (a ``FutureWarning``).

    ``positional``: a feature map passed by position (a tuple holding it), which counts as given."""
    if OLD not in kwargs:
        return kwargs
    old = kwargs.pop(OLD)
    given = positional if positional is not None else ((kwargs[NEW],) if NEW in kwargs else None)
    if given is not None:
        raise ValueError(
            f"{where + '() ' if where else ''}got both {OLD}={old!r} and {NEW}={given[0]!r}: `{OLD}=` is the "
            f"deprecated name of `{NEW}=`, pass {NEW} only"
        )
    warn_renamed(f"`{OLD}=` is deprecated, use `{NEW}=`" + (f" ({where})" if where else ""))
    kwargs[NEW] = old
    return kwargs


def feature_map_alias(fn: F) -> F:
    """Decorate ``fn`` (which takes ``feature_map``, by name or through ``**kwargs``) so that callers
    may still pass the old ``kernel=``."""
    params = list(inspect.signature(fn).parameters.values())
    positional = [p.name for p in params if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
    index = positional.index(NEW) if NEW in positional else None  # where a positional feature map sits
    where = fn.__qualname__.replace(".__init__", "")

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if OLD in kwargs:
            positional = (args[index],) if index is not None and len(args) > index else None
            kwargs = map_old_keyword(kwargs, where, positional)
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def upgrade_model_kwargs(kwargs: dict) -> dict:
    """A stored mapping of model arguments with the old key ``kernel`` renamed to ``feature_map``
    (silently: the file is not the caller's code); both present: a ``ValueError``."""
    if not isinstance(kwargs, dict) or OLD not in kwargs:
        return kwargs
    if NEW in kwargs:
        raise ValueError(f"model arguments hold both {OLD}={kwargs[OLD]!r} and {NEW}={kwargs[NEW]!r} (one name)")
    return {(NEW if k == OLD else k): v for k, v in kwargs.items()}


def renamed_state_keys(keys: Iterable[str], own: Collection[str]) -> dict[str, str]:
    """``{old key: new key}`` for the state-dict keys of a learnable feature map stored under its old
    attribute name (``*kernel.*`` -> ``*feature_map.*``) whose new key is one of ``own``."""
    renames = {}
    for key in keys:
        new = _OLD_SEGMENT.sub(r"\1" + NEW + ".", key)
        if new != key and key not in own and new in own:
            renames[key] = new
    return renames


def renamed_attributes(module: str, renamed: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__``: each old name of ``renamed`` gives its new name's object, with a
    ``FutureWarning``."""

    def __getattr__(name: str) -> Any:
        if name in renamed:
            warn_renamed(f"`{module}.{name}` is deprecated, use `{renamed[name]}`")
            return getattr(sys.modules[module], renamed[name])
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
