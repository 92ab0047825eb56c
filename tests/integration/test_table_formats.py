"""Sinks as Apache Iceberg / Delta Lake tables with a real local Spark, read back by DuckDB (its own
iceberg/delta extensions, in a child process: no Epochal code) and compared with a pandas oracle.

The job is made here (not the demo): shipments JOIN deliveries -> ``delivered`` (append), per-carrier
totals -> ``carrier_totals`` (upsert). Covers commits with the formats' transaction markers, idempotent
recover-and-commit, a rewind that makes the table current at the restored checkpoint (history kept for time
travel), export through the format, and the schema check at start."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import load_config
from pipeline.exceptions import IncompatibleSinkSchemaError
from pipeline.job import Job
from pipeline.runtime.runner import JobRunner

pytestmark = [pytest.mark.spark, pytest.mark.table_formats]

TS = pa.timestamp("us", tz="UTC")
SHIP = pa.schema([("ship_id", pa.string()), ("carrier", pa.string()), ("weight", pa.float64()),
                  ("_ingest_ts", TS)])
DELIV = pa.schema([("ship_id", pa.string()), ("ok", pa.bool_()), ("_ingest_ts", TS)])
EPOCH_S = 60
T0 = pd.Timestamp("2026-01-01T00:00:00Z")


def build_job(fmt: str, *, extra: str | None = None) -> Job:
    job = Job("shipping")
    ships = job.source("shipments", SHIP, key="ship_id")
    deliv = job.source("deliveries", DELIV, key="ship_id").filter("ok")
    sel = ["ship_id", "carrier", "weight"] + ([f"{extra}"] if extra else [])
    joined = ships.select(*sel).join(deliv.select("ship_id", "ok"), on="ship_id", uid="deliv_join")
    joined.sink("delivered", format=fmt)
    joined.aggregate(uid="carrier_agg", key="carrier",
                     aggs={"n": ("count", None), "kg": ("sum", "weight")}).sink("carrier_totals", mode="upsert",
                                                                              format=fmt)
    return job


def write_sources(root: Path, epochs: int = 4, per_epoch: int = 40) -> None:
    for e in range(epochs):
        for p in range(2):
            ids = [f"s{e}-{p}-{i}" for i in range(per_epoch)]
            ts = [T0 + pd.Timedelta(seconds=e * EPOCH_S + i) for i in range(per_epoch)]
            ship = pa.table({"ship_id": ids, "carrier": [f"c{(i * 7 + e) % 5}" for i in range(per_epoch)],
                             "weight": [float(i % 13) + 0.5 for i in range(per_epoch)],
                             "_ingest_ts": pa.array(ts, TS)}, schema=SHIP)
            # one delivery per shipment, in the other partition; every third arrives an epoch later
            dids = [f"s{e}-{1 - p}-{i}" if i % 3 else f"s{e - 1}-{1 - p}-{i}" for i in range(per_epoch)
                    if i % 3 or e > 0]
            dl = pa.table({"ship_id": dids, "ok": [int(d.rsplit("-", 1)[1]) % 4 != 1 for d in dids],
                           "_ingest_ts": pa.array(ts[:len(dids)], TS)}, schema=DELIV)
            for name, t in (("shipments", ship), ("deliveries", dl)):
                d = root / name / f"partition={p}"
                d.mkdir(parents=True, exist_ok=True)
                pq.write_table(t, d / f"{e:08d}.parquet")


def oracle(root: Path, upto_epoch: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Independent recomputation with pandas over the source files of epochs <= upto_epoch."""
    def load(name):
        t = pd.concat([pd.read_parquet(f) for f in sorted((root / name).rglob("*.parquet"))])
        # epochs are numbered from the unix epoch in EPOCH_S slices
        return t[t["_ingest_ts"] < pd.Timestamp((upto_epoch + 1) * EPOCH_S, unit="s", tz="UTC")]
    ships, deliv = load("shipments"), load("deliveries")
    deliv = deliv[deliv["ok"]]
    j = ships.merge(deliv[["ship_id"]], on="ship_id")[["ship_id", "carrier", "weight"]]
    tot = j.groupby("carrier").agg(n=("ship_id", "count"), kg=("weight", "sum")).reset_index()
    return j.sort_values("ship_id").reset_index(drop=True), tot.sort_values("carrier").reset_index(drop=True)


def duck(fmt: str, location: str, tmp: Path) -> pd.DataFrame:
    out = tmp / f"duck-{os.getpid()}-{len(list(tmp.glob('duck-*')))}.parquet"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run([sys.executable, "-m", "pipeline.testing.table_readers", fmt, location, str(out)], check=True,
                   env=env, timeout=120)
    return pd.read_parquet(out)


def location(runner: JobRunner, table: str) -> str:
    t = runner._table(table)
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


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_exactly_once_rewind_and_engine_reads(tmp_path, fmt):
    src = tmp_path / "src"
    write_sources(src)
    first = int(T0.timestamp()) // EPOCH_S
    r = make_runner(tmp_path, src, fmt)
    r.run(2)
    check(r, fmt, src, tmp_path, first + 1)
    tbl = r._table("delivered")
    cur = tbl.current_checkpoint()
    assert cur == r.coordinator.store.latest().checkpoint_id
    # recover-and-commit of the same checkpoint: the table already has it (its own markers) -> nothing twice
    md = r.coordinator.store.latest().metadata
    before = tbl.version_id()
    r._recover_sinks(md)
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


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
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
