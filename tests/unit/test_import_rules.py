"""Import rules of the package (docs/ARCHITECTURE.md): no module shadows a standard-library module (under
spark-submit the package directory can be on ``sys.path``), the runtime does not import the quality package
at module level, and no library module imports the demo at module level."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PKG = Path(__file__).resolve().parents[2] / "pipeline"


def _modules():
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def _top_level_imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_no_module_shadows_the_standard_library():
    shadows = [str(p.relative_to(PKG)) for p in _modules() if p.stem in sys.stdlib_module_names]
    assert shadows == []


def test_runtime_does_not_import_quality_at_module_level():
    bad = [str(p.relative_to(PKG)) for p in (PKG / "runtime").glob("*.py")
           if any(m.startswith("pipeline.quality") for m in _top_level_imports(p))]
    assert bad == []


def test_library_does_not_import_the_demo_at_module_level():
    bad = [str(p.relative_to(PKG)) for p in _modules()
           if p.relative_to(PKG).parts[0] not in ("demo", "jobs", "testing")
           and any(m.startswith("pipeline.demo") for m in _top_level_imports(p))]
    assert bad == []
