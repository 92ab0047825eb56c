"""The CLI command and the data-quality DAG call the suites."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import corrupt
import pytest
from conftest import CLOCK, make_runner

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
@pytest.mark.spark
@pytest.mark.slow
def test_cli_validate_exits_non_zero_on_failure(deployment, tmp_path):
    corrupt.drop_state_row(deployment, 3)
    env = {**os.environ, "PIPELINE_SOURCE_URI": (deployment / "src").as_uri(),
           "PIPELINE_CHECKPOINT_URI": (deployment / "ckpt").as_uri(),
           "PIPELINE_SINK_URI": (deployment / "sink").as_uri(), "PIPELINE_CLOCK_NOW": CLOCK,
           "EPOCHAL_DATA_DOCS_DIR": str(tmp_path / "docs"), "GX_ANALYTICS_ENABLED": "False"}
    cmd = [sys.executable, "-m", "pipeline", "validate", "--job", "orders_payments", "--checkpoint", "3", "--json"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["success"] is False and out["snapshot"] == "chk-3"
    failed = {s["suite"] for s in out["suites"] if not s["success"]}
    assert "epochal_recovery_conservation" in failed
    assert "Calculating Metrics" not in proc.stderr, "GX progress bars must be silenced"


@pytest.mark.airflow
def test_data_quality_dag_parses_without_io(tmp_path):
    """Thin DAG file: params form (checkpoint id or savepoint URI), tags, retries, doc_md; parsing it imports
    neither Great Expectations nor Spark."""
    code = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("dq", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
d = m.dag
print(json.dumps({"dag_id": d.dag_id, "tags": sorted(d.tags), "params": list(d.params),
                  "tasks": [t.task_id for t in d.tasks], "retries": [t.retries for t in d.tasks],
                  "doc": d.doc_md, "schedule": type(d.timetable).__name__,
                  "gx": "great_expectations" in sys.modules, "spark": "pyspark.sql.session" in sys.modules}))
"""
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    proc = subprocess.run([sys.executable, "-c", code, str(REPO / "dags" / "epochal_data_quality.py")], env=env,
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(proc.stdout.strip().splitlines()[-1])
    assert d["dag_id"] == "epochal_orders_payments_data_quality"
    assert {"epochal", "data-quality"} <= set(d["tags"])
    assert d["params"] == ["checkpoint"] and d["tasks"] == ["validate"]
    assert all(r >= 1 for r in d["retries"])
    assert d["schedule"] == "NullTimetable"
    assert d["doc"].strip().startswith("### Epochal: data quality")
    assert not d["gx"] and not d["spark"], "no Great Expectations / Spark import while parsing the DAG"


@pytest.mark.spark
@pytest.mark.slow
def test_the_quality_task_shows_the_summary_once(good_deployment, caplog, monkeypatch):
    """The Airflow restore DAG's validate task echoes the validation summary into its log; validate_job does not
    log it again (the cheap level: the check is about the logging, not the suites)."""
    import logging

    from pipeline.orchestration.tasks import Orchestrator
    monkeypatch.setenv("EPOCHAL_RESTORE_VALIDATE", "cheap")
    runner = make_runner(good_deployment)
    echoed: list[str] = []
    orch = Orchestrator("orders_payments", runner.config, echo=echoed.append, runner_factory=lambda: runner)
    with caplog.at_level(logging.INFO):
        out = orch.validate_restore(3)
    assert out["success"] is True, out
    shown = [m for m in echoed if "Data quality of job" in m]
    logged = [r for r in caplog.records if r.levelno >= logging.INFO and "Data quality of job" in r.getMessage()]
    assert len(shown) == 1 and not logged, (shown, [r.getMessage() for r in logged])
