"""The test tree collects in any subset: no test module imports a ``conftest`` by name, and no two
test folders hold modules of the same name.

pytest imports test files and their helpers by base name (its default "prepend" import mode, no
``__init__.py`` in the folders), so ``from conftest import X`` gets whichever folder's conftest
was imported first, and two ``helpers.py`` shadow each other: a pair of files from two folders
then fails to collect although each collects alone.
"""

from __future__ import annotations

import ast
import collections
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent


def _modules() -> list[pathlib.Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "data" not in p.relative_to(TESTS).parts)


def test_no_test_module_imports_a_conftest():
    offenders = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            if any(n.split(".")[0] == "conftest" for n in names):
                offenders.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    assert not offenders, f"import shared test values from a helper module, not a conftest: {offenders}"


def test_module_names_are_unique_across_test_folders():
    folders = collections.defaultdict(list)
    for path in _modules():
        if path.name not in ("conftest.py", "__init__.py"):
            folders[path.stem].append(str(path.parent.relative_to(TESTS)))
    clashes = {name: where for name, where in folders.items() if len(where) > 1}
    assert not clashes, f"test modules of one name in several folders shadow each other: {clashes}"
