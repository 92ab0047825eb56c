"""Issue 34, item 4: every bad ``--job`` is one configuration-error line and exit 2, never a traceback.

``--job '../x:y'`` used to reach ``importlib.import_module('../x')``, which raises ``TypeError`` (a relative
import without a package), not ``ImportError``: exit 1 and a traceback. The CLI runs in this process
(``pipeline.cli.main``), with file:// roots in the test's tmp dir; nothing is written before the job is loaded.
"""
from __future__ import annotations

import pytest

from pipeline.cli import main

pytestmark = pytest.mark.unit

BAD_JOBS = [
    "../x:y",           # a path, not a module: TypeError from importlib before the fix
    ".x:y",             # a relative module: the same TypeError
    "..:y",
    "x/y:z",
    "a b:c",
    "x:y:z",            # two colons
    "x:",
    ":y",
    "x:../y",
    "no_such_module_epochal_34:build",
    "json:no_such_function",
    "json:JSONDecodeError",  # a class: calling it fails, say so
    "broken_job_module_34:build",  # the module raises at import
    "no_such_job_name",
]


@pytest.fixture
def roots(tmp_path, monkeypatch):
    for key in ("SOURCE", "CHECKPOINT", "SINK"):
        monkeypatch.setenv(f"PIPELINE_{key}_URI", (tmp_path / key.lower()).as_uri())
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "broken_job_module_34.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    return tmp_path


@pytest.mark.parametrize("job", BAD_JOBS)
@pytest.mark.parametrize("command", [["checkpoints", "list"], ["run", "--epochs", "1"]])
def test_bad_job_is_one_configuration_error_line(roots, capsys, job, command):
    rc = main([*command, "--job", job])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("epochal: configuration error: "), err
    assert repr(job) in lines[0], err
    assert "Traceback" not in err
    assert not (roots / "checkpoint").exists() or not any((roots / "checkpoint").rglob("*"))
