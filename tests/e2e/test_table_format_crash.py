"""Crash test for Iceberg / Delta sinks: a job of the tests' own making (``pipeline.testing.shipping``) run as
a subprocess and SIGKILLed (whole process group) between ``_metadata`` and the table commit, between
Epochal's commit log entry and the table commit, while writing state and before ``_metadata``; resumed each
time. Then DuckDB (its iceberg/delta extensions, in a child process: no Epochal code) reads the committed
tables and they must equal the pandas oracle: every row once, none lost. On file:// and on moto S3."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from pipeline.config import load_config
from pipeline.jobs import get_job
from pipeline.runtime.driver.runner import JobRunner
from pipeline.testing.jobproc import run_job_process
from pipeline.testing.shipping import oracle, write_sources
from pipeline.testing.table_readers import read_in_child

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow, pytest.mark.table_formats,
              pytest.mark.skipif(not os.environ.get("EPOCHAL_TABLE_FORMATS_FULL"),
                                 reason="~5 min per case: EPOCHAL_TABLE_FORMATS_FULL=1 (docs/table-formats.md)")]

JOB = "pipeline.testing.shipping:build_job"
KILLS = ["after_metadata_before_commit", "after_commit_log_before_table_commit", "writing_state",
         "after_commit_log_before_table_commit", "after_state_before_metadata", "after_metadata_before_commit"]


def _crash_and_check(fmt: str, root: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_sources(src, epochs=len(KILLS) + 2, per_epoch=30)
    env = {"PIPELINE_SOURCE_URI": src.as_uri(), "PIPELINE_CHECKPOINT_URI": f"{root}/ckpt",
           "PIPELINE_SINK_URI": f"{root}/sink", "PIPELINE_PARALLELISM": "2", "PIPELINE_EPOCH_SECONDS": "60",
           "PIPELINE_CLOCK_NOW": "2026-01-02T00:00:00Z", "PIPELINE_SINK_FORMAT": fmt,
           "PIPELINE_ICEBERG_CATALOG_URI": f"sqlite:///{tmp_path}/catalog.db",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    killed = 0
    for point in KILLS:
        r = run_job_process(["run", "--job", JOB, "--epochs", "1"], {**env, "EPOCHAL_KILL_AT": f"{point}:1"})
        assert r.returncode in (0, -9), f"{point}: exit {r.returncode}\n" + "\n".join(r.stderr_lines[-30:])
        killed += r.returncode == -9
    assert killed >= len(KILLS) - 1, f"only {killed} runs were killed"
    final = run_job_process(["run", "--job", JOB], env)
    assert final.returncode == 0, "\n".join(final.stderr_lines[-30:])
    os.environ.update({k: v for k, v in env.items() if k.startswith("PIPELINE_")})
    try:
        cfg = load_config()
    finally:
        for k in env:
            if k.startswith("PIPELINE_"):
                os.environ.pop(k, None)
    runner = JobRunner(get_job(JOB), cfg, echo=lambda m: None)
    latest = runner.coordinator.store.latest()
    exp_j, exp_t = oracle(src, latest.epoch)
    for table, exp, cols, by in (("delivered", exp_j, ["ship_id", "carrier", "weight"], "ship_id"),
                                 ("carrier_totals", exp_t, ["carrier", "n", "kg"], "carrier")):
        t = runner.table(table)
        assert t.current_checkpoint() == latest.checkpoint_id, table
        loc = t.metadata_location() if fmt == "iceberg" else t.table_uri
        got = read_in_child(fmt, loc, tmp_path)[cols].sort_values(by).reset_index(drop=True)
        pd.testing.assert_frame_equal(got, exp.reset_index(drop=True), check_dtype=False)


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_format_crash_recovery_local(tmp_path, fmt):
    _crash_and_check(fmt, (tmp_path / "store").as_uri(), tmp_path)


@pytest.mark.s3
@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_format_crash_recovery_s3(tmp_path, fmt):
    # moto in its own process: delta-rs holds the GIL in some calls, which stalls an in-process moto server
    from pipeline.testing.moto_server import moto_s3_process
    with moto_s3_process(buckets=["crash-formats"]):
        _crash_and_check(fmt, f"s3://crash-formats/{tmp_path.name}", tmp_path)
