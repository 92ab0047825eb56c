"""Shared helpers for the barrier handler tests (pure Python, no Spark)."""
from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_REPO = _HERE.parents[2]
for _path in (_REPO, _HERE):  # the package without installing it; barrier_helpers in any import mode
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


def pytest_configure(config):  # the marker is declared in pyproject.toml too; harmless twice
    config.addinivalue_line("markers", "unit: pure Python, no Spark/Airflow (fast)")
