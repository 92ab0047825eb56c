"""Fixtures of the unit tests.

``state_cache_dir``: the executors' warm-state cache (``PIPELINE_STATE_CACHE_DIR``) in the test's own tmp dir and
the in-process cache of recently written state (``backend._RECENT``) empty before and after the test, so every
test reads state it wrote itself. Modules that need it say ``pytest.mark.usefixtures("state_cache_dir")``.
"""
from __future__ import annotations

import pytest


@pytest.fixture
def state_cache_dir(tmp_path, monkeypatch):
    from pipeline.state import backend

    monkeypatch.setenv("PIPELINE_STATE_CACHE_DIR", str(tmp_path / "warm"))
    monkeypatch.setenv("PIPELINE_STATE_STORE_DIR", str(tmp_path / "stores"))  # rocksdb: the executor's stores
    backend._RECENT.clear()
    yield tmp_path / "warm"
    backend._RECENT.clear()
