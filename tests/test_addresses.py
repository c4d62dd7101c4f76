"""One address per name: no module exists only to re-export another, and no module other than a
package's ``__init__`` hands on a name it imports.

A module that is not a package's ``__init__`` hands a name on when it imports it from the project
and then never uses it (it is only there to be imported from this module, or listed in
``__all__``). An alias-only module is one whose body is nothing but a docstring, imports,
``__all__``, ``sys.modules`` or ``__getattr__`` assignments and a ``__main__`` guard.
"""

from __future__ import annotations

import ast
import pathlib

import inline_attn

SRC = pathlib.Path(inline_attn.__file__).resolve().parent


def _is_passive(node: ast.stmt) -> bool:
    """A statement that defines nothing of its own: a docstring, an import, ``__all__``, an
    assignment to ``sys.modules[...]`` or ``__getattr__``, or an ``if __name__ == "__main__"``."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return True
    if isinstance(node, ast.Assign):
        names = [ast.unparse(t) for t in node.targets]
        return all(n in ("__all__", "__getattr__") or n.startswith("sys.modules[") for n in names)
    if isinstance(node, ast.If):
        return "__name__" in ast.unparse(node.test)
    return False


def alias_only(tree: ast.Module) -> bool:
    """Whether a module's body only re-exports (see :func:`_is_passive`)."""
    return bool(tree.body) and all(_is_passive(node) for node in tree.body)


def handed_on(tree: ast.Module, module: str) -> list[str]:
    """The names ``module`` imports from the project (``inline_attn`` or relative) only to pass them
    on: never read in the module, or listed in its ``__all__``."""
    imported = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("inline_attn")):
            for alias in node.names:
                if alias.name != "*":
                    imported[alias.asname or alias.name] = node.lineno
    listed, in_all = set(), set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(ast.unparse(t) == "__all__" for t in node.targets):
            in_all |= {id(c) for c in ast.walk(node.value)}
            listed |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    # a string annotation (``"Tensor"``) names its types too
    used |= {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier() and id(n) not in in_all
    }
    passed = [name for name in imported if name not in used or name in listed]
    return [f"{module}:{imported[name]} {name}" for name in sorted(passed)]


def _modules(root: pathlib.Path = SRC):
    for path in sorted(root.rglob("*.py")):
        if path.name != "__init__.py":
            yield str(path.relative_to(root)), ast.parse(path.read_text())


def test_no_alias_only_module():
    aliases = [name for name, tree in _modules() if alias_only(tree)]
    assert not aliases, "modules that only re-export (import from the home module instead):\n" + "\n".join(aliases)


def test_no_name_is_handed_on_outside_a_package_init():
    found = [line for name, tree in _modules() for line in handed_on(tree, name)]
    assert not found, "names imported only to be imported from here (import from their home):\n" + "\n".join(found)


def test_the_scan_sees_aliases_and_hand_ons():
    alias = ast.parse('"""Old name."""\nimport sys\nfrom . import home\nsys.modules[__name__] = home\n')
    real = ast.parse("from .home import f\n\ndef g():\n    return f()\n")
    assert alias_only(alias) and not alias_only(real)
    source = (
        "from .home import used, passed, listed, both\n"
        "from inline_attn.x import Typed\n"
        "__all__ = ['listed', 'both']\n"
        "def g(t: 'Typed'):\n    return used(both)\n"
    )
    assert handed_on(ast.parse(source), "m.py") == ["m.py:1 both", "m.py:1 listed", "m.py:1 passed"]
    assert handed_on(real, "m.py") == []
