"""The package layering: imports run down the floors only, lazy ones included, and no private name
crosses a package.

The floors, bottom up: ``ops``, ``data`` < ``layers`` < ``models`` < ``runtime`` (what every run
needs) < ``train``, ``dense``, ``analysis``, ``bench`` < ``experiments`` < ``cli``. A package imports
nothing from its own floor or above, except that the applications (``train``, ``dense``,
``analysis``, ``bench``) may take the named entries of :data:`ENTRIES` from each other. Every
module under ``src/inline_attn`` is parsed, and every import counts: top-level or inside a function,
relative or absolute, and ``importlib.import_module`` with a literal name. Inside ``dense``,
``dense.models`` imports neither ``dense.data`` nor a task module, and ``dense.data`` no model or
task module (:data:`DENSE_BLOCKS`).
"""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

import pytest

import inline_attn

SRC = pathlib.Path(inline_attn.__file__).resolve().parent

APPS = ("train", "dense", "analysis", "bench")
FLOORS = (("ops", "data"), ("layers",), ("models",), ("runtime",), APPS, ("experiments",), ("cli",))
# package -> the packages it must not import: its floor's other packages and every floor above
FORBIDDEN = {
    p: tuple(q for upper in FLOORS[i:] for q in upper if q != p) for i, floor in enumerate(FLOORS) for p in floor
}
# the named entries an application may take from another: {importer: {module: names}}
ENTRIES = {"analysis": {"inline_attn.train.evaluate": {"load_trained_model", "trained_data_info"}}}


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    line: int
    module: str  # dotted module imported from (absolute)
    name: Optional[str] = None  # the name taken from it by ``from module import name``


def module_name(path: pathlib.Path, root: pathlib.Path) -> tuple[str, bool]:
    """Dotted name of ``path`` under ``root``'s parent, and whether it is a package's ``__init__``."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_pkg else parts), is_pkg


def _resolve(package: str, level: int, module: Optional[str]) -> str:
    base = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join(base + ([module] if module else []))


def imports_of(source: str, module: str, is_pkg: bool) -> list[Import]:
    """Every import in ``source`` (of the module ``module``), at any depth, with relative names resolved."""
    package = module if is_pkg else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(module, node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(package, node.level, node.module) if node.level else node.module
            found += [Import(module, node.lineno, target, a.name) for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            name = node.args[0].value
            if name.startswith("."):
                level = len(name) - len(name.lstrip("."))
                name = _resolve(package, level, name[level:] or None)
            found.append(Import(module, node.lineno, name))
    return found


def all_imports(root: pathlib.Path = SRC) -> list[Import]:
    found = []
    for path in sorted(root.rglob("*.py")):
        found += imports_of(path.read_text(), *module_name(path, root))
    return found


def package_of(dotted: str, root: pathlib.Path = SRC) -> Optional[str]:
    """The first-level package (or root module) of ``inline_attn`` that ``dotted`` names; "" for the
    root itself, None outside the project."""
    parts = dotted.split(".")
    if parts[0] != root.name:
        return None
    return parts[1] if len(parts) > 1 else ""


def targets(imp: Import, root: pathlib.Path = SRC) -> str:
    """The first-level package an import reaches: ``from inline_attn import train`` reaches ``train``."""
    pkg = package_of(imp.module, root)
    if pkg == "" and imp.name and ((root / imp.name).is_dir() or (root / f"{imp.name}.py").is_file()):
        return imp.name
    return pkg


def private_part(imp: Import) -> Optional[str]:
    """The private name an import takes from below its package's root: a ``_name`` or a ``_module``."""
    below = imp.module.split(".")[2:]  # a private module at the root (_io) is the whole package's
    private = [p for p in below if p.startswith("_") and not p.startswith("__")]
    if imp.name and imp.name.startswith("_") and not imp.name.startswith("__"):
        private.append(imp.name)
    return private[0] if private else None


def test_the_scanner_sees_lazy_relative_absolute_and_import_module_imports():
    source = (
        "import inline_attn.ops\n"
        "from ..train.config import load_config\n"
        "from .. import dense\n"
        "def f():\n"
        "    from inline_attn import cli\n"
        "    import importlib\n"
        "    importlib.import_module('..bench.timing', __package__)\n"
        "    importlib.import_module('inline_attn.analysis')\n"
    )
    found = imports_of(source, "inline_attn.models.registry", is_pkg=False)
    reached = sorted(targets(i) for i in found if package_of(i.module) is not None)
    assert reached == ["analysis", "bench", "cli", "dense", "ops", "train"]
    # a package's __init__ resolves its relative imports from itself, not from its parent
    (imp,) = imports_of("from .registry import create_model", "inline_attn.models", is_pkg=True)
    assert imp == Import("inline_attn.models", 1, "inline_attn.models.registry", "create_model")
    # the real tree: the command modules import the applications lazily, and the scan sees it
    edges = {(package_of(i.importer), targets(i)) for i in all_imports()}
    assert {("cli", "dense"), ("cli", "train"), ("experiments", "analysis"), ("models", "layers")} <= edges


def is_entry(imp: Import) -> bool:
    """Whether ``imp`` takes a named entry of :data:`ENTRIES` (an application's door for another)."""
    return imp.name in ENTRIES.get(package_of(imp.importer), {}).get(imp.module, ())


def test_the_floors_forbid_sideways_and_upward_imports():
    assert FORBIDDEN["ops"] == ("data", "layers", "models", "runtime", *APPS, "experiments", "cli")
    assert FORBIDDEN["models"] == ("runtime", *APPS, "experiments", "cli")
    assert FORBIDDEN["dense"] == ("train", "analysis", "bench", "experiments", "cli")
    assert FORBIDDEN["cli"] == ()
    entry = Import("inline_attn.analysis.common", 1, "inline_attn.train.evaluate", "load_trained_model")
    assert is_entry(entry) and not is_entry(Import(entry.importer, 1, entry.module, "evaluate_checkpoint"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_run_down_the_floors(package):
    upward = [
        f"{i.importer}:{i.line} imports {i.module}" + (f".{i.name}" if i.name else "")
        for i in all_imports()
        if package_of(i.importer) == package and targets(i) in FORBIDDEN[package] and not is_entry(i)
    ]
    assert not upward, f"{package} must import nothing from {FORBIDDEN[package]}:\n" + "\n".join(upward)


# inside dense, three blocks: the tasks and their helpers at dense's top, then two blocks under them
# that know nothing of the top (but the config classes the data sets are built from) nor each other
DENSE_BLOCKS = {
    "inline_attn.dense.models": ("inline_attn.dense.models",),
    "inline_attn.dense.data": ("inline_attn.dense.data", "inline_attn.dense.config"),
}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def dense_module(imp: Import, root: pathlib.Path = SRC) -> Optional[str]:
    """The module of ``dense`` an import reaches (``from inline_attn.dense import data`` reaches
    ``inline_attn.dense.data``); None outside ``dense``."""
    if not _within(imp.module, f"{root.name}.dense"):
        return None
    named = root / "dense" / (imp.name or "")
    if imp.module == f"{root.name}.dense" and imp.name and (named.is_dir() or named.with_suffix(".py").is_file()):
        return f"{imp.module}.{imp.name}"
    return imp.module


def dense_block_breaches(imports: list[Import]) -> list[str]:
    """Imports from ``dense.models`` or ``dense.data`` of a dense module outside what their block may take."""
    found = []
    for imp in imports:
        block = next((b for b in DENSE_BLOCKS if _within(imp.importer, b)), None)
        target = dense_module(imp)
        if block and target and not any(_within(target, ok) for ok in DENSE_BLOCKS[block]):
            found.append(f"{imp.importer}:{imp.line} imports {target}")
    return found


def test_dense_models_import_neither_data_nor_a_task_and_data_no_model():
    breaches = dense_block_breaches(all_imports())
    assert not breaches, "dense.models / dense.data reach outside their block:\n" + "\n".join(breaches)


def test_the_dense_block_scan_sees_a_model_reading_data_and_data_reading_a_task():
    models = "inline_attn.dense.models.segmentor"
    fake = imports_of("from ..data.loading import collate\nfrom .. import seg_task\n", models, is_pkg=False)
    fake += imports_of("def f():\n    from ..seg_task import SegTask\n", "inline_attn.dense.data.coco", is_pkg=False)
    fake += imports_of("from ..models.boxes import nms\n", "inline_attn.dense.data.coco", is_pkg=False)
    fake += imports_of("from inline_attn.dense import build_segmentor\n", models, is_pkg=False)
    allowed = imports_of("from .heads import resize\nfrom ...runtime.finite import require_finite\n", models, False)
    allowed += imports_of("from ..config import SegConfig\n", "inline_attn.dense.data.loading", is_pkg=False)
    assert dense_block_breaches(fake) == [
        f"{models}:1 imports inline_attn.dense.data.loading",
        f"{models}:2 imports inline_attn.dense.seg_task",
        "inline_attn.dense.data.coco:2 imports inline_attn.dense.seg_task",
        "inline_attn.dense.data.coco:1 imports inline_attn.dense.models.boxes",
        f"{models}:1 imports inline_attn.dense",
    ]
    assert dense_block_breaches(allowed) == []


def test_no_private_name_crosses_a_package():
    crossing = {
        (i.importer, i.module, i.name): f"{i.importer}:{i.line} takes {private_part(i)} from {i.module}"
        for i in all_imports()
        if package_of(i.module) not in (None, "")
        and targets(i) != package_of(i.importer)
        and private_part(i) is not None
    }
    assert not crossing, "private names imported across packages (make them public):\n" + "\n".join(crossing.values())


def test_analysis_and_reproduce_import_neither_train_nor_its_cli():
    # at run time too: analysis reads YAML without the training package; reproduce uses train.config,
    # not the command module
    code = (
        "import sys, inline_attn.cli.analyze, inline_attn.analysis.runner\n"
        "assert not [m for m in sys.modules if m.startswith('inline_attn.train')], sorted(sys.modules)\n"
        "import inline_attn.experiments.reproduce\n"
        "assert 'inline_attn.cli.train' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


TOOLS = pathlib.Path(__file__).resolve().parents[1] / "tools"


def test_tools_take_only_public_names_of_the_package():
    # tools/ sits outside the installed package and uses it as a user would
    crossing = [
        f"{i.importer}:{i.line} takes {private_part(i) or i.name} from {i.module}"
        for i in all_imports(TOOLS)
        if i.module.split(".")[0] == SRC.name
        and (private_part(i) or any(p.startswith("_") and not p.startswith("__") for p in i.module.split(".")[1:2]))
    ]
    assert not crossing, "tools/ must import inline_attn through public names only:\n" + "\n".join(crossing)


def test_the_package_imports_no_tool_and_knows_no_lease():
    # the GPU-lease harnesses and the audits live in tools/; the library neither imports nor names them,
    # and writes no file of this repository's docs/ (a report's path is the user's argument)
    tool_imports = [
        f"{i.importer}:{i.line} imports {i.module}" for i in all_imports() if i.module.split(".")[0] == "tools"
    ]
    assert not tool_imports, "\n".join(tool_imports)
    named = {
        str(p.relative_to(SRC)): word
        for p in sorted(SRC.rglob("*.py"))
        for word in ("gpu_check", "docs/results")
        if word in p.read_text()
    }
    named.update(
        {str(p.relative_to(SRC)): "lease" for p in sorted(SRC.rglob("*.py")) if re.search(r"\blease", p.read_text())}
    )
    assert not named, f"modules naming a tool, a lease or a docs/ results path: {named}"


def _options(parser) -> set[str]:
    """Every option string of ``parser`` and of its subcommands, all the way down."""
    import argparse

    found = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _options(sub)
    return found


def test_the_package_writes_into_no_docs_file():
    # tables go into the repository's docs through tools/update_docs.py, which reads a command's report
    # from its output folder: no command of the package takes a docs file, no library function takes
    # one, and no module knows a docs section's markers
    from inline_attn.cli import build_parser

    options = _options(build_parser())
    assert "--output" in options  # the walk reached the subcommands
    assert not {o for o in options if re.fullmatch(r"--(docs?|replace-fewer|docs?-\w+)", o)}
    params = [
        f"{p.relative_to(SRC)}:{fn.lineno} {fn.name}({a.arg}=...)"
        for p in sorted(SRC.rglob("*.py"))
        for fn in ast.walk(ast.parse(p.read_text()))
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for a in fn.args.args + fn.args.kwonlyargs
        if a.arg in ("doc_path", "doc_file", "replace_fewer")  # `doc` is a setting's docstring in runtime.config
    ]
    assert not params, "library functions taking a docs file:\n" + "\n".join(params)
    markers = [
        str(p.relative_to(SRC)) for p in sorted(SRC.rglob("*.py")) if re.search(r"<!--[^>]*:begin", p.read_text())
    ]
    assert not markers, f"modules writing a docs section (its markers): {markers}"
