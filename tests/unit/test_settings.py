"""One settings surface (issue 30 item 5): the process environment is read in ``pipeline/config.py`` (the
``PIPELINE_*`` keys of PipelineConfig) and ``pipeline/settings.py`` (every other variable, declared with type,
default and doc line) only, and every variable the package names is declared in one of them."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pipeline import settings
from pipeline.config import CONFIG_KEYS

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "pipeline"

#: the settings modules: the only ones that read the process environment
SETTINGS_MODULES = ("config.py", "settings.py")

#: modules that touch ``os.environ`` directly, with the reason
ALLOWED: dict[str, str] = {
    # the shipped test doubles start servers and subprocesses (moto, a Spark cluster, a Connect server, job
    # processes): they copy and edit the environment of those children and restore this process's own
    "testing/moto_server.py": "starts moto: sets and restores the AWS_* variables of this process",
    "testing/cluster.py": "starts a Spark standalone cluster: builds its processes' environment",
    "testing/connect_server.py": "starts a Spark Connect server: builds its process's environment",
    "testing/jobproc.py": "runs a job in a subprocess: hands the environment on",
    "testing/s3_faults.py": "runs a fault proxy in a subprocess: hands the environment on",
    "testing/table_readers.py": "reads sink tables with DuckDB in a subprocess: hands the environment on",
    "testing/doubles.py": "a failing-storage double sets and restores a fault switch of this process",
    "demo/oracle.py": "the demo's oracle imports nothing from the pipeline by design (an independent check): "
                      "reads the AWS_* variables itself",
}


def _os_environ_uses(source: str) -> list[int]:
    """Lines that use ``os.environ`` / ``os.getenv`` (or import ``environ`` / ``getenv`` from ``os``)."""
    lines: list[int] = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "os" \
                and n.attr in ("environ", "getenv", "environb", "getenvb", "putenv", "unsetenv"):
            lines.append(n.lineno)
        elif isinstance(n, ast.ImportFrom) and n.module == "os" \
                and any(a.name in ("environ", "getenv", "environb", "getenvb") for a in n.names):
            lines.append(n.lineno)
    return sorted(set(lines))


def test_only_the_settings_modules_read_the_environment():
    bad: dict[str, list[int]] = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).as_posix()
        if "__pycache__" in p.parts or rel in SETTINGS_MODULES or rel in ALLOWED:
            continue
        lines = _os_environ_uses(p.read_text())
        if lines:
            bad[rel] = lines
    assert bad == {}, ("os.environ / os.getenv outside pipeline/config.py and pipeline/settings.py (declare the "
                       f"variable in pipeline/settings.py and read it with settings.value() & co): {bad}")


def test_allowed_modules_still_need_it():
    stale = [m for m in ALLOWED if not _os_environ_uses((PKG / m).read_text())]
    assert stale == []


def test_scan_finds_environment_reads():
    src = ("import os\nfrom os import getenv\n"
           "a = os.environ.get('X')\nb = os.getenv('Y')\nos.environ['Z'] = '1'\nc = dict(os.environ)\n")
    assert _os_environ_uses(src) == [2, 3, 4, 5, 6]


_VAR = re.compile(r"\b(?:PIPELINE|EPOCHAL)_[A-Z0-9_]*[A-Z0-9]\b")


def test_every_variable_the_package_names_is_declared():
    """A ``PIPELINE_*`` / ``EPOCHAL_*`` name in the package (or the DAGs and plugins) is a PipelineConfig key or
    declared in pipeline/settings.py, with a type and a doc line."""
    undeclared: dict[str, list[str]] = {}
    for top in ("pipeline", "dags", "plugins", "include"):
        for p in sorted((REPO / top).rglob("*.py")):
            for var in set(_VAR.findall(p.read_text())):
                if var not in CONFIG_KEYS and var not in settings.SETTINGS and var != "PIPELINE_X":
                    undeclared.setdefault(var, []).append(str(p.relative_to(REPO)))
    assert undeclared == {}
    for s in settings.SETTINGS.values():
        assert s.type and s.doc and s.scope in ("driver", "executors", "airflow", "internal", "provided"), s


def test_values_defaults_and_undeclared_names():
    env = {"PIPELINE_S3_PART_MB": "64", "EPOCHAL_DAG_RETRIES": "", "EPOCHAL_WORKER_RELEASE_MEMORY": "off"}
    assert settings.get_int("PIPELINE_S3_PART_MB", env) == 64
    assert settings.get_int("EPOCHAL_DAG_RETRIES", env) == 2          # empty counts as unset: the default
    assert settings.get_flag("EPOCHAL_WORKER_RELEASE_MEMORY", env) is False
    assert settings.get_flag("EPOCHAL_BATCH_NATIVE_READ", env) is True
    assert settings.value("EPOCHAL_END_DATE", env) is None
    with pytest.raises(KeyError, match="not declared"):
        settings.raw("EPOCHAL" + "_UNDECLARED", env)   # (split: the README's test-switch check scans tests/)
    with pytest.raises(KeyError, match="no declared default"):
        settings.get_str("EPOCHAL_END_DATE", env)
