"""Runs the tutorial page (docs/tutorial/first-job.md) as written: its code and its commands.

The page is a sequence of fenced blocks. ``python title="tutorial_job.py"`` blocks are the user's module, in order
(each appends to the file); ``bash`` blocks are commands; a ``text`` block after a ``bash`` block is what the
commands print. :func:`run_sections` executes the sections (``## `` headings) it is given, in this process:

* ``export K=V`` sets the variable (``/tmp/epochal-tutorial`` and ``$PWD`` are mapped into a scratch directory);
* ``python -m pipeline ARGS`` is :func:`pipeline.cli.main` (the same parser and commands), which must return 0;
* ``python -m pipeline.demo.generate ARGS`` is the generator's ``main``;
* the set-up lines of :data:`SKIPPED` are not run (the test already runs in the venv); any other line fails.

The printed lines of a ``text`` block that start with a stable prefix (:data:`CHECKED_PREFIXES`) must appear in what
the commands printed, with every number replaced by ``#`` (timings, sizes and dates vary), so the page cannot drift
from what Epochal prints.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tutorial" / "first-job.md"
MODULE = "tutorial_job"
TUTORIAL_ROOT = "/tmp/epochal-tutorial"
SKIPPED = ("scripts/bootstrap.sh", "source .venv/bin/activate")
CHECKED_PREFIXES = ("job ", "checkpoint ", "exported ", "Data quality of job ", "  ok ")

_FENCE = re.compile(r'^```(\w+)([^\n]*)\n(.*?)^```\s*$', re.S | re.M)
_TITLE = re.compile(r'title="([^"]+)"')


@dataclass
class Block:
    lang: str
    title: str | None
    body: str


@dataclass
class Section:
    heading: str
    blocks: list[Block] = field(default_factory=list)


def sections(text: str | None = None) -> list[Section]:
    """The page's ``## `` sections with their fenced blocks, in order (the part before the first is "")."""
    text = PAGE.read_text() if text is None else text
    out = [Section("")]
    heads = [(m.start(), m.group(1).strip()) for m in re.finditer(r"^## (.+)$", text, re.M)]
    for m in _FENCE.finditer(text):
        while heads and heads[0][0] < m.start():
            out.append(Section(heads.pop(0)[1]))
        t = _TITLE.search(m.group(2))
        out[-1].blocks.append(Block(m.group(1), t.group(1) if t else None, m.group(3)))
    return out


def module_source(text: str | None = None) -> str:
    """The user's module: every ``python title="tutorial_job.py"`` block, concatenated."""
    return "".join(b.body for s in sections(text) for b in s.blocks if b.lang == "python" and b.title == "tutorial_job.py")


def _normal(line: str) -> str:
    return " ".join(re.sub(r"\d+(\.\d+)?", "#", line).split())


def expected_lines(block: Block, mapping=lambda line: line) -> list[str]:
    return [_normal(mapping(l)) for l in block.body.splitlines() if l.startswith(CHECKED_PREFIXES)]


@dataclass
class Runner:
    """Executes the commands of bash blocks in this process, inside ``workdir``."""

    workdir: Path
    printed: list[str] = field(default_factory=list)

    def _map(self, s: str) -> str:
        s = s.replace(TUTORIAL_ROOT, str(self.workdir / "epochal-tutorial"))
        return s.replace("$PWD", str(self.workdir))

    def line(self, line: str) -> None:
        line = line.strip()
        if not line or line.startswith("#") or line in SKIPPED:
            return
        if line.startswith("export "):
            key, _, value = line.removeprefix("export ").partition("=")
            os.environ[key] = self._map(value)
            if key == "PYTHONPATH" and os.environ[key] not in sys.path:
                sys.path.insert(0, os.environ[key])
            return
        argv = [self._map(a) for a in shlex.split(line)]
        if argv[:3] == ["python", "-m", "pipeline.demo.generate"]:
            from pipeline.demo.generate import main as generate
            rc = self._call(generate, argv[3:])
        elif argv[:3] == ["python", "-m", "pipeline"]:
            from pipeline.cli import main as cli
            sys.modules.pop(MODULE, None)  # the module grows between sections: import what the page says now
            importlib.invalidate_caches()
            rc = self._call(cli, argv[3:])
        else:
            raise AssertionError(f"the tutorial runs a command this test does not know: {line!r}")
        assert rc in (0, None), f"{line!r} exited with {rc}:\n" + "\n".join(self.printed[-40:])

    def _call(self, fn, argv: list[str]) -> int | None:
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                return fn(argv)
        finally:
            self.printed += out.getvalue().splitlines() + err.getvalue().splitlines()

    def check_output(self, block: Block, since: int = 0) -> None:
        got = {_normal(l) for l in self.printed[since:]}
        missing = [l for l in expected_lines(block, self._map) if l not in got]
        assert not missing, ("the tutorial shows lines its commands no longer print:\n" + "\n".join(missing)
                             + "\n--- printed:\n" + "\n".join(self.printed[-60:]))


def run_sections(workdir: Path, names: list[str], text: str | None = None) -> Runner:
    """Write the module into ``workdir``, then run the bash blocks of the named sections (by heading prefix) in
    page order and check each ``text`` block against what its commands printed."""
    (workdir / f"{MODULE}.py").write_text(module_source(text))
    runner = Runner(workdir)
    for sec in sections(text):
        if not any(sec.heading.startswith(n) for n in names):
            continue
        mark = 0
        for b in sec.blocks:
            if b.lang == "bash":
                mark = len(runner.printed)
                for line in b.body.splitlines():
                    runner.line(line)
            elif b.lang == "text":
                runner.check_output(b, mark)
    return runner
