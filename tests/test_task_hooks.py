"""The task protocol's shape: one :class:`~inline_attn.runtime.task.Task` for every task, whose
"what" hooks (those that raise NotImplementedError) every task implements, with ceilings on the
number of hooks, on the default hooks only one task overrides and on the size of the
classification task, so the run's "how" does not drift back into a task. ``runtime`` stands on
the package's ``_io`` alone."""

from __future__ import annotations

import ast
import inspect
import pathlib
import textwrap

import inline_attn
from inline_attn.dense.det_task import DetTask
from inline_attn.dense.seg_task import SegTask
from inline_attn.runtime.task import Task
from inline_attn.train.task import ClassifyTask

SRC = pathlib.Path(inline_attn.__file__).resolve().parent
TASKS = (ClassifyTask, SegTask, DetTask)
# the protocol's bounds: at most 16 hooks, no default overridden by one task alone (a task's own
# "how" belongs to the run), ClassifyTask at most 150 lines
MAX_HOOKS = 16
MAX_OVERRIDDEN_ALONE = 0
MAX_CLASSIFY_LINES = 150


def hooks(cls: type = Task) -> list[str]:
    return sorted(n for n, v in vars(cls).items() if inspect.isfunction(v) and not n.startswith("_"))


def is_abstract(fn) -> bool:
    """Whether ``fn``'s body is a docstring and ``raise NotImplementedError``."""
    body = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body
    last = body[-1]
    return isinstance(last, ast.Raise) and "NotImplementedError" in ast.unparse(last)


def owner(task: type, name: str) -> type:
    return next(c for c in task.__mro__ if name in vars(c))


def abstract_hooks() -> list[str]:
    return [n for n in hooks() if is_abstract(vars(Task)[n])]


def overridden_alone() -> list[str]:
    """The default hooks that exactly one task overrides (a shared base such as DenseTask counts
    for each task under it)."""
    alone = []
    for name in set(hooks()) - set(abstract_hooks()):
        takers = [t.__name__ for t in TASKS if owner(t, name) is not Task]
        if len(takers) == 1:
            alone.append(f"{takers[0]}.{name}")
    return sorted(alone)


def test_every_task_implements_every_abstract_hook():
    assert len(abstract_hooks()) >= 8  # the scan finds them (datasets, model, losses, ...)
    missing = [f"{t.__name__}.{n}" for t in TASKS for n in abstract_hooks() if owner(t, n) is Task]
    assert not missing, f"implement these 'what' hooks (or make them the run's): {missing}"


def test_the_protocol_stays_small():
    assert len(hooks()) <= MAX_HOOKS, f"Task has {len(hooks())} hooks: {hooks()}"
    alone = overridden_alone()
    assert len(alone) <= MAX_OVERRIDDEN_ALONE, f"defaults overridden by one task alone: {alone}"
    lines = len(inspect.getsource(ClassifyTask).splitlines())
    assert lines <= MAX_CLASSIFY_LINES, f"ClassifyTask has {lines} lines"


def test_the_scan_sees_an_abstract_hook_left_out():
    class Half(Task):
        def datasets(self, cfg, info, progress):
            return None, None

    assert owner(Half, "datasets") is Half and owner(Half, "losses") is Task
    assert is_abstract(Task.losses) and not is_abstract(Task.input_norm)


def test_runtime_imports_nothing_of_the_package_but_io():
    found = []
    for path in sorted((SRC / "runtime").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 2 and node.module != "_io":
                found.append(f"{path.name}:{node.lineno} from {'.' * node.level}{node.module or ''}")
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("inline_attn"):
                found.append(f"{path.name}:{node.lineno} from {node.module}")
    assert not found, found


def test_the_run_counts_appends_and_says_stopped_once():
    """One step counter, one ``history.append`` and one stop message in the run code
    (``runtime``, ``train``, ``dense``)."""
    counts = {"step += 1": 0, "history.append(": 0, "stopped (": 0}
    for part in ("runtime", "train", "dense"):
        for path in sorted((SRC / part).rglob("*.py")):
            text = path.read_text()
            for needle in counts:
                counts[needle] += text.count(needle)
    assert counts == {"step += 1": 1, "history.append(": 1, "stopped (": 1}, counts


def test_the_dense_cli_names_its_task_classes():
    """``cli/dense.py`` finds a task in a plain table of classes, not by a module name in a string."""
    from inline_attn.cli.dense import task_classes

    assert task_classes() == {"seg": SegTask, "det": DetTask}
    assert "importlib" not in (SRC / "cli" / "dense.py").read_text()
