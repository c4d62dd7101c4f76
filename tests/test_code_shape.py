"""Code-shape bounds of issue 24, kept from growing back: no function in ``src/inline_attn`` is
longer than 80 lines, Triton kernels (``@triton.jit``) excepted, whose bodies follow the
equations of one tile and read best in one piece. (The complexity bound, McCabe 15, is ruff's
C901 in pyproject.toml.)"""

from __future__ import annotations

import ast
import pathlib

import inline_attn

SRC = pathlib.Path(inline_attn.__file__).resolve().parent
MAX_LINES = 80


def _is_triton_kernel(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


def long_functions(root: pathlib.Path, max_lines: int = MAX_LINES) -> list[str]:
    """``path:line name (n lines)`` for every function or method over ``max_lines``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_triton_kernel(node):
                n = node.end_lineno - node.lineno + 1
                if n > max_lines:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({n} lines)")
    return found


def test_no_function_over_80_lines():
    assert not long_functions(SRC), "split these functions (issue 24's bound):\n" + "\n".join(long_functions(SRC))


def test_the_scan_sees_a_long_function_and_spares_a_kernel(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n\n@triton.jit\ndef kernel():\n{body}\n")
    assert long_functions(tmp_path) == [f"m.py:1 long ({MAX_LINES + 1} lines)"]


def test_no_two_public_classes_share_a_name():
    where: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(str(path.relative_to(SRC)))
    shared = {name: files for name, files in where.items() if len(files) > 1}
    assert not shared, f"one name, one class (issue 24): {shared}"
