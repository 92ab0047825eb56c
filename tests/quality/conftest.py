"""Fixtures of the data-quality tests.

``good_deployment`` (session): a small local deployment - demo sources, checkpoints and sink tables - built
once by running the real job on local Spark (3 epochs x 2 partitions x 300 orders). ``deployment`` gives
each test its own relocated copy (``corrupt.relocate``), so tests can break it freely.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

from corrupt import relocate  # noqa: E402

CLOCK = "2026-06-01T00:00:00Z"
EPOCHS, PARTITIONS, ORDERS = 3, 2, 300


@pytest.fixture(autouse=True)
def _quality_env(monkeypatch, tmp_path):
    """No usage statistics or progress bars; Data Docs of automatic validations go to the test's tmp dir."""
    monkeypatch.setenv("GX_ANALYTICS_ENABLED", "False")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setenv("EPOCHAL_DATA_DOCS_DIR", str(tmp_path / "auto_data_docs"))


def make_runner(root: Path, **overrides):
    from pipeline.config import load_config
    from pipeline.jobs import get_job
    from pipeline.runtime.driver.runner import JobRunner
    cfg = load_config(env={}, source_uri=(root / "src").as_uri(), checkpoint_uri=(root / "ckpt").as_uri(),
                      sink_uri=(root / "sink").as_uri(), clock_now=CLOCK, **overrides)
    return JobRunner(get_job("orders_payments"), cfg, echo=lambda m: None)


@pytest.fixture(scope="session")
def good_deployment(tmp_path_factory) -> Path:
    from pipeline.demo.generate import generate
    root = tmp_path_factory.mktemp("quality") / "good"
    generate((root / "src").as_uri(), epochs=EPOCHS, partitions=PARTITIONS, orders_per_epoch=ORDERS, seed=11)
    rep = make_runner(root).run()
    assert len(rep.completed) == EPOCHS, rep.to_dict()
    return root


@pytest.fixture
def deployment(good_deployment, tmp_path) -> Path:
    dst = tmp_path / "deployment"
    relocate(good_deployment, dst)
    return dst


@pytest.fixture
def docs_dir(tmp_path) -> str:
    return str(tmp_path / "data_docs")


def failed_suites(result) -> set[str]:
    return {s.suite for s in result.suites if not s.success}


def failed_expectations(result) -> set[tuple[str, str]]:
    """(suite, column(s)) of every failed expectation."""
    return {(e.suite, e.columns) for e in result.failed_expectations}


os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
