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
    bad = [str(p.relative_to(PKG)) for p in (PKG / "runtime").rglob("*.py")
           if any(m.startswith("pipeline.quality") for m in _top_level_imports(p))]
    assert bad == []


def _all_imports(path: Path) -> set[str]:
    """Every module a file imports, at any level (module top, functions, methods)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_library_imports_neither_the_demo_nor_a_job():
    """Nothing outside ``pipeline/demo`` and ``pipeline/jobs`` (the demo job and the job registry) imports the
    demo or a particular job, at any level - test helpers in ``pipeline/testing`` included. The registry
    (``from pipeline.jobs import get_job``) is how the CLI and the DAG factory find jobs by name."""
    bad = {}
    for p in _modules():
        if p.relative_to(PKG).parts[0] in ("demo", "jobs"):
            continue
        hits = sorted(m for m in _all_imports(p)
                      if m.startswith("pipeline.demo") or m == "pipeline.jobs.orders_payments"
                      or (m.startswith("pipeline.jobs.") and m.split(".")[2] not in ("get_job", "job_names",
                                                                                    "register_job")))
        if hits:
            bad[str(p.relative_to(PKG))] = hits
    assert bad == {}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(path: Path) -> set[str]:
    """Modules of the package a file imports at any level, except under ``if TYPE_CHECKING:`` (annotations
    only: no import happens at run time)."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("pipeline"):
                out.add(child.module)
                out.update(f"{child.module}.{a.name}" for a in child.names)
            elif isinstance(child, ast.Import):
                out.update(a.name for a in child.names if a.name.startswith("pipeline"))
            visit(child)
    visit(ast.parse(path.read_text()))
    return out


def _package_graph() -> dict[str, set[str]]:
    """Subpackage (or top-level module) -> the subpackages/modules it imports, at any level."""
    def unit(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else "pipeline"
    names = {_module_name(p) for p in _modules()}
    graph: dict[str, set[str]] = {}
    for p in _modules():
        src = unit(_module_name(p))
        for m in _runtime_imports(p):
            while m and m not in names:
                m = m.rpartition(".")[0]
            dst = unit(m) if m else "pipeline"
            if dst not in (src, "pipeline"):
                graph.setdefault(src, set()).add(dst)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_subpackages_import_one_way():
    """Imports go one way between the package's parts (``config``, ``checkpoint``, ``runtime``, ``quality``,
    ``orchestration``...), function-level imports included: no cycle. The runtime reaches the quality suites
    through :mod:`pipeline.runtime.driver.validation` (a port), never by importing them."""
    graph = _package_graph()
    assert _cycles(graph) == [], {k: sorted(v) for k, v in graph.items()}
    assert "quality" not in graph.get("runtime", set()) and "runtime" not in graph.get("config", set())


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_modules_import_one_way():
    """No cycle between modules either (e.g. the operator registry imports no operator module; DAG ids and
    plugin routes live in orchestration/names.py, which the factory, the tasks and the UI all import)."""
    names = {_module_name(p) for p in _modules()}
    graph: dict[str, set[str]] = {}
    for p in _modules():
        src = _module_name(p)
        for m in _runtime_imports(p):
            while m and m not in names:
                m = m.rpartition(".")[0]
            if m and m != src and not src.startswith(m + "."):   # a package's __init__ is not a dependency cycle
                graph.setdefault(src, set()).add(m)
    assert _cycles(graph) == []


def _function_level_imports(path: Path) -> list[int]:
    """Line numbers of ``pipeline`` imports inside functions or methods (not under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    lines: list[int] = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] == "pipeline":
                lines.append(node.lineno)
            elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "pipeline" for a in node.names):
                lines.append(node.lineno)
    return sorted(set(lines))


def test_imports_inside_functions_state_their_reason():
    """Imports sit at the top of modules (issue 11). An import of the package inside a function needs a stated
    reason: a comment on its line, or a paragraph ``Lazy imports:`` in the module's docstring (for a module
    that keeps all of them lazy, e.g. because Airflow imports it when it parses DAG files)."""
    bad = {}
    for p in _modules():
        lines = _function_level_imports(p)
        if not lines:
            continue
        doc = ast.get_docstring(ast.parse(p.read_text())) or ""
        if "Lazy imports:" in doc:
            continue
        text = p.read_text().splitlines()
        missing = [n for n in lines if "#" not in text[n - 1]]
        if missing:
            bad[str(p.relative_to(PKG))] = missing
    assert bad == {}, f"imports inside functions without a stated reason (module: lines): {bad}"


#: the rooms of ``pipeline/runtime`` (by where the code runs) and the rooms each must not import
RUNTIME_ROOMS = ("driver", "spark", "operators")
FORBIDDEN_ROOMS = {"operators": {"driver", "spark"}, "spark": {"driver"}}


def _room_violations(pkg: Path) -> dict[str, list[str]]:
    """``{module: [imports of a forbidden room]}`` under ``pkg/runtime``, at any level (annotation-only imports
    under ``if TYPE_CHECKING:`` excepted), ``from pipeline.runtime import driver`` included."""
    bad: dict[str, list[str]] = {}
    for p in sorted((pkg / "runtime").rglob("*.py")):
        rel = p.relative_to(pkg / "runtime").parts
        if len(rel) < 2 or rel[0] not in FORBIDDEN_ROOMS:
            continue
        hits = sorted({m for m in _runtime_imports(p) if m.split(".")[:2] == ["pipeline", "runtime"]
                       and len(m.split(".")) > 2 and m.split(".")[2] in FORBIDDEN_ROOMS[rel[0]]})
        if hits:
            bad[str(p.relative_to(pkg))] = hits
    return bad


def test_runtime_rooms_import_one_way():
    """``pipeline/runtime`` is in three rooms (pipeline/runtime/__init__.py): ``operators`` (the executors' tasks)
    imports neither ``driver`` nor ``spark``; ``spark`` (sessions, routing, the Spark plan of a round and of each
    operator) does not import ``driver``. Every module of the runtime lives in a room."""
    assert _room_violations(PKG) == {}
    loose = sorted(p.name for p in (PKG / "runtime").glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"runtime modules outside a room: {loose}"
    assert sorted(p.name for p in (PKG / "runtime").iterdir() if p.is_dir() and p.name != "__pycache__") == \
        sorted(RUNTIME_ROOMS)


def test_room_rule_finds_a_violation(tmp_path):
    """The room check fails on an operator task importing the driver, a function-level import included, and on
    the Spark room importing the driver through ``from pipeline.runtime import driver``."""
    for room in RUNTIME_ROOMS:
        (tmp_path / "runtime" / room).mkdir(parents=True)
    (tmp_path / "runtime" / "operators" / "bad.py").write_text(
        "def f():\n    from pipeline.runtime.driver.runner import JobRunner  # lazy: test\n    return JobRunner\n")
    (tmp_path / "runtime" / "spark" / "bad.py").write_text("from pipeline.runtime import driver\n")
    (tmp_path / "runtime" / "driver" / "fine.py").write_text(
        "from pipeline.runtime.operators.task import task_report\nfrom pipeline.runtime.spark import session\n")
    (tmp_path / "runtime" / "operators" / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pipeline.runtime.spark.dataflow import OperatorIO\n")
    assert _room_violations(tmp_path) == {
        "runtime/operators/bad.py": ["pipeline.runtime.driver.runner", "pipeline.runtime.driver.runner.JobRunner"],
        "runtime/spark/bad.py": ["pipeline.runtime.driver"]}
