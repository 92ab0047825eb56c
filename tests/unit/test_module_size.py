"""Module and function size (issue 30): a module over 400 lines, a function over 80 lines or one over 8
parameters states why in its docstring (a paragraph starting ``Over 400 lines:``, ``Over 80 lines:`` or
``Over 8 parameters:``), so that a long module, function or signature is a decision, not an accident."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PKG = Path(__file__).resolve().parents[2] / "pipeline"
LIMIT = 400


def _long_without_reason(pkg: Path) -> list[str]:
    out = []
    for p in sorted(pkg.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        text = p.read_text()
        if len(text.splitlines()) <= LIMIT:
            continue
        if "Over 400 lines:" not in (ast.get_docstring(ast.parse(text)) or ""):
            out.append(str(p.relative_to(pkg)))
    return out


def test_long_modules_state_why():
    assert _long_without_reason(PKG) == []


def test_the_size_rule_finds_a_long_module(tmp_path):
    (tmp_path / "long.py").write_text('"""A long module."""\n' + "x = 1\n" * LIMIT)
    (tmp_path / "why.py").write_text('"""A long module.\n\nOver 400 lines: one table."""\n' + "x = 1\n" * LIMIT)
    (tmp_path / "short.py").write_text('"""Short."""\nx = 1\n')
    assert _long_without_reason(tmp_path) == ["long.py"]


FN_LINES, FN_PARAMS = 80, 8


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return len([n for n in names if n not in ("self", "cls")])


def _functions_without_reason(pkg: Path) -> list[str]:
    """Functions over 80 lines or 8 parameters whose docstring does not say why (``Over 80 lines: ...``,
    ``Over 8 parameters: ...``)."""
    out = []
    for p in sorted(pkg.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        for fn in ast.walk(ast.parse(p.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(fn) or ""
            where = f"{p.relative_to(pkg)}:{fn.lineno} {fn.name}"
            if (fn.end_lineno or fn.lineno) - fn.lineno + 1 > FN_LINES and f"Over {FN_LINES} lines:" not in doc:
                out.append(f"{where} (lines)")
            if _params(fn) > FN_PARAMS and f"Over {FN_PARAMS} parameters:" not in doc:
                out.append(f"{where} (parameters)")
    return out


def test_long_functions_state_why():
    assert _functions_without_reason(PKG) == []


def test_the_function_rule_finds_long_functions_and_long_signatures(tmp_path):
    body = "    x = 1\n" * FN_LINES
    (tmp_path / "m.py").write_text(
        f'def long():\n    """Long."""\n{body}\n'
        f'def why():\n    """Long.\n\n    Over 80 lines: one table."""\n{body}\n'
        'def wide(self, a, b, c, d, e, f, g, h, *, i):\n    """Wide."""\n'
        'def ok(self, a, b, c, d, e, f, g, h):\n    """Eight."""\n')
    assert _functions_without_reason(tmp_path) == ["m.py:1 long (lines)", "m.py:169 wide (parameters)"]
