"""Airflow test fixtures: one throwaway AIRFLOW_HOME with a migrated metadata DB per test session.

``airflow_home`` must be requested before anything imports ``airflow`` in this process (Airflow reads its
configuration at import time); every test module here imports Airflow only inside fixtures and tests.
The migrated SQLite DB is also the template that the real-scheduler test copies for its own instance.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from af_helpers import VENV_BIN, airflow_base_env


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory) -> Path:
    """A migrated AIRFLOW_HOME for in-process Airflow (DagBag, dag.test)."""
    home = tmp_path_factory.mktemp("airflow_home")
    env = airflow_base_env(home)
    if "airflow" in sys.modules:
        from airflow.configuration import AIRFLOW_HOME
        if Path(AIRFLOW_HOME).resolve() != home.resolve():
            pytest.skip(f"airflow was imported before the test AIRFLOW_HOME was set (it uses {AIRFLOW_HOME})")
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    t0 = time.monotonic()
    proc = subprocess.run([str(VENV_BIN / "airflow"), "db", "migrate"], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    print(f"[airflow] db migrate in {time.monotonic() - t0:.1f}s ({home})")
    shutil.copy2(home / "airflow.db", home / "airflow.migrated.db")  # pristine copy for other instances
    yield home
    mp.undo()


@pytest.fixture(scope="session")
def airflow_db_template(airflow_home) -> Path:
    """The freshly migrated DB (before any test ran a DAG in it)."""
    return airflow_home / "airflow.migrated.db"
