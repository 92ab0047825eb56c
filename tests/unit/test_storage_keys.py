"""Every storage key Epochal writes or parses is built in the layout package (issue 30 item 4): a test that
fails on a key literal anywhere else in ``pipeline/``.

A key literal is (1) a string literal given to :func:`pipeline.fileio.join_uri` (how keys are joined), (2) one of
the layout's file names (``_metadata``, ``_pending.json``, ...), or (3) a name prefix that carries an id -
``chk-``, ``sp-``, ``txn-``, ``kg-``, ``epoch-`` - followed by the id's place in an f-string or a regex
(``f"chk-{id}"``, ``r"epoch-(\\d+)"``). Docstrings are not code and are not scanned; messages that name a
checkpoint use :func:`pipeline.layout.snapshot_name` like the history does.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PKG = Path(__file__).resolve().parents[2] / "pipeline"

#: where keys are built and parsed: the layout package, and the source layout (the contract of the *input*
#: files users write, ``partition=<p>/<seq>.parquet``, with the dead letters of files that break it)
LAYOUT_MODULES = ("layout", "source/layout.py")

#: the layout's file names (a literal equal to one of them outside the layout is a key literal)
FILE_NAMES = frozenset({"_metadata", "_pending.json", "job.json", "_plan.json", "_commits", "_dead_letter"})

#: a name prefix followed by an id: the end of an f-string piece, a regex group or digit class, a format field
ID_PREFIX = re.compile(r"(?<![\w])(chk|sp|txn|kg|epoch)-(?=$|\(|\\d|\{|\[)")

#: (module, literal) pairs that look like keys but are not, each with its reason
ALLOWED: dict[tuple[str, str], str] = {
    ("batch/evaluation/source_read.py", "_metadata"): "Spark's hidden file-metadata column, not a storage key",
    # the demo and the test scenarios write *source* data (user input under the source root, named by the
    # source layout's contract), not keys Epochal writes
    ("demo/generate.py", "orders"): "a source name of the demo job",
    ("demo/generate.py", "payments"): "a source name of the demo job",
    ("testing/scenarios.py", "orders"): "a source name of the demo job",
    ("testing/scenarios.py", "_generator.json"): "the demo generator's own record of its settings",
    ("testing/scenarios.py", "00000000.parquet"): "the first source file of a partition (source layout contract)",
}


def _docstrings(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def key_literals(source: str) -> list[tuple[int, str]]:
    """``(line, literal)`` of the key literals in a module's source (see the module docstring)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    hits: list[tuple[int, str]] = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name == "join_uri":
                hits += [(a.lineno, a.value) for a in n.args[1:]
                         if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            if n.value in FILE_NAMES or n.value.lstrip("/") in FILE_NAMES or ID_PREFIX.search(n.value):
                hits.append((n.lineno, n.value))
    return sorted(set(hits))


def _in_layout(path: Path) -> bool:
    rel = path.relative_to(PKG).as_posix()
    return any(rel == m or rel.startswith(m + "/") or rel == m + ".py" for m in LAYOUT_MODULES)


def test_no_storage_key_literal_outside_the_layout():
    bad: dict[str, list[str]] = {}
    for p in sorted(PKG.rglob("*.py")):
        if "__pycache__" in p.parts or _in_layout(p):
            continue
        rel = p.relative_to(PKG).as_posix()
        hits = [f"{line}: {lit!r}" for line, lit in key_literals(p.read_text()) if (rel, lit) not in ALLOWED]
        if hits:
            bad[rel] = hits
    assert bad == {}, f"storage-key literals outside pipeline/layout (build them with pipeline.layout): {bad}"


def test_key_scan_finds_key_literals():
    src = ('"""Doc: chk-{id} and _metadata are fine in a docstring."""\n'
           "from pipeline.fileio import join_uri\n"
           "def f(root, cid):\n"
           "    a = join_uri(root, 'failed')\n"
           "    b = f'{root}/chk-{cid}'\n"
           "    c = re.compile(r'epoch-(\\d+)\\.json$')\n"
           "    d = root + '/_metadata'\n"
           "    e = '--epoch-seconds'\n"
           "    return 'no checkpoint: chk-<id> in a message'\n")
    assert [lit for _, lit in key_literals(src)] == ["failed", "/chk-", "epoch-(\\d+)\\.json$", "/_metadata"]
