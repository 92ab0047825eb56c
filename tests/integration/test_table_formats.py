"""Sinks as Apache Iceberg / Delta Lake tables with a real local Spark, read back by DuckDB (its own
iceberg/delta extensions, in a child process: no Epochal code) and compared with a pandas oracle.

The job is made here (not the demo): shipments JOIN deliveries -> ``delivered`` (append), per-carrier
totals -> ``carrier_totals`` (upsert). Covers commits with the formats' transaction markers, idempotent
recover-and-commit, a rewind that makes the table current at the restored checkpoint (history kept for time
travel), export through the format, and the schema check at start."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipeline.config import load_config
from pipeline.exceptions import IncompatibleSinkSchemaError
from pipeline.job import Job
from pipeline.runtime.driver.runner import JobRunner
from pipeline.testing.shipping import DELIV, EPOCH_S, SHIP, T0, build_job, oracle, write_sources
from pipeline.testing.table_readers import read_in_child

pytestmark = [pytest.mark.spark, pytest.mark.table_formats]
FULL = pytest.mark.skipif(not os.environ.get("EPOCHAL_TABLE_FORMATS_FULL"),
                          reason="slow variant: EPOCHAL_TABLE_FORMATS_FULL=1 (docs/table-formats.md)")


def duck(fmt: str, location: str, tmp: Path) -> pd.DataFrame:
    return read_in_child(fmt, location, tmp)


def location(runner: JobRunner, table: str) -> str:
    t = runner.table(table)
    return t.metadata_location() if t.format_name == "Iceberg" else t.table_uri


def check(runner, fmt, src: Path, tmp: Path, upto_epoch: int) -> None:
    exp_j, exp_t = oracle(src, upto_epoch)
    got_j = duck(fmt, location(runner, "delivered"), tmp)[["ship_id", "carrier", "weight"]]
    got_t = duck(fmt, location(runner, "carrier_totals"), tmp)[["carrier", "n", "kg"]]
    pd.testing.assert_frame_equal(got_j.sort_values("ship_id").reset_index(drop=True), exp_j, check_dtype=False)
    pd.testing.assert_frame_equal(got_t.sort_values("carrier").reset_index(drop=True), exp_t, check_dtype=False)


def make_runner(tmp: Path, src: Path, fmt: str, job: Job | None = None, **kw) -> JobRunner:
    cfg = load_config(env={}, source_uri=src.as_uri(), checkpoint_uri=(tmp / "ckpt").as_uri(),
                      sink_uri=(tmp / "sink").as_uri(), epoch_seconds=EPOCH_S, parallelism=2,
                      clock_now="2026-01-02T00:00:00Z", **{"retained_checkpoints": 10, **kw})
    return JobRunner(job or build_job(fmt), cfg, echo=lambda m: None)


# Iceberg by default: Delta rewinds run by default in tests/airflow/test_epoch_dags.py (the demo job's sinks)
@pytest.mark.parametrize("fmt", ["iceberg", pytest.param("delta", marks=FULL)])
def test_exactly_once_rewind_and_engine_reads(tmp_path, fmt):
    src = tmp_path / "src"
    write_sources(src)
    first = int(T0.timestamp()) // EPOCH_S
    r = make_runner(tmp_path, src, fmt)
    r.run(2)
    check(r, fmt, src, tmp_path, first + 1)
    tbl = r.table("delivered")
    cur = tbl.current_checkpoint()
    assert cur == r.coordinator.store.latest().checkpoint_id
    # recover-and-commit of the same checkpoint: the table already has it (its own markers) -> nothing twice
    md = r.coordinator.store.latest().metadata
    before = tbl.version_id()
    r.ctx.recover_sinks(md)
    assert tbl.version_id() == before
    r.run(2)
    check(r, fmt, src, tmp_path, first + 3)
    # rewind: re-run epoch first+1 (Airflow clear) -> the table is current at checkpoint of epoch `first`, then
    # re-processed; rewound history stays in the table
    r.process_epoch(first + 1)
    check(r, fmt, src, tmp_path, first + 1)
    assert tbl.find(cur) is not None  # the rewound branch is still there for time travel
    # export reads the format
    out = tmp_path / "export"
    res = r.export("carrier_totals", str(out))
    assert res["format"].lower() == fmt
    exp_t = oracle(src, first + 1)[1]
    got = pq.read_table(out).to_pandas()[["carrier", "n", "kg"]].sort_values("carrier").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, exp_t, check_dtype=False)
    # restore of the newest checkpoint again: the table comes back to it
    r.run(2)
    check(r, fmt, src, tmp_path, first + 3)


@pytest.mark.parametrize("fmt", ["iceberg", pytest.param("delta", marks=FULL)])
def test_incompatible_schema_change_refused_at_start(tmp_path, fmt):
    src = tmp_path / "src"
    write_sources(src, epochs=2, per_epoch=10)
    make_runner(tmp_path, src, fmt).run(1)
    # a changed type is refused when the plan is built (before any task runs), naming the table and column
    bad_job = Job("shipping")
    ships = bad_job.source("shipments", SHIP, key="ship_id")
    deliv = bad_job.source("deliveries", DELIV, key="ship_id").filter("ok")
    j = ships.select("ship_id", "carrier", "CAST(weight AS STRING) AS weight").join(
        deliv.select("ship_id", "ok"), on="ship_id", uid="deliv_join")
    j.sink("delivered", format=fmt)
    j.aggregate(uid="carrier_agg", key="carrier", aggs={"n": ("count", None)}).sink(
        "carrier_totals", mode="upsert", format=fmt)
    with pytest.raises(IncompatibleSinkSchemaError, match="delivered.*weight"):
        make_runner(tmp_path, src, fmt, job=bad_job).run(1)
