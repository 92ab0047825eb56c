"""The batch evaluation's native source read (Spark's Parquet reader, positions from the listing and
``_metadata.row_index``) returns exactly the rows, positions and processing epochs of the runtime's reader
(``EPOCHAL_BATCH_NATIVE_READ=0``), and files the native read cannot read the same way go through the runtime's
reader (real local Spark, file://, a job of its own)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import Job
from pipeline.batch.evaluation.prefix import Prefix
from pipeline.batch.evaluation.source_read import NATIVE_ENV, native_files, native_type, prefix_files, source_dataframe

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("k", pa.string()), ("x", pa.float64()), ("n", pa.int32()), ("_ingest_ts", TS)])
T0 = 1_780_000_000 // 60 * 60 * 1_000_000
E_US = 60_000_000
CLOCK = "2027-01-01T00:00:00Z"


def _job() -> Job:
    job = Job("nr_job", max_parallelism=8)
    job.source("events", SCHEMA, key="k").aggregate(uid="per-k", key="k", aggs={"c": ("count", None)}).sink(
        "per_k", mode="upsert")
    return job


def _table(rng, n: int, e0: int, e1: int, *, bad: bool) -> pa.Table:
    ts = np.sort(T0 + rng.integers(e0 * E_US, e1 * E_US, n))
    keys = [f"k{v:03d}" for v in rng.integers(0, 50, n)]
    ts_list: list = [int(t) for t in ts]
    if bad:   # null key, empty key, null _ingest_ts: dead-lettered by the runtime's reader
        keys[1], keys[2] = None, ""
        ts_list[3] = None
    return pa.table({"k": keys, "x": np.round(rng.uniform(0, 9, n), 3), "n": pa.array(rng.integers(0, 9, n),
                     pa.int32()), "_ingest_ts": pa.array(ts_list, pa.int64()).cast(TS)}, schema=SCHEMA)


def _write_sources(src: Path) -> None:
    """Two partitions x 4 files: clean files, files with bad records, a file with an extra column, one whose
    ``n`` is int64 (cast by the runtime's reader: not native), a JSON Lines file and a corrupt Parquet file."""
    rng = np.random.default_rng(7)
    for p in range(2):
        d = src / "events" / f"partition={p}"
        d.mkdir(parents=True)
        for seq in range(4):
            t = _table(rng, 40, seq, seq + 1, bad=(seq == 1))
            if p == 0 and seq == 2:
                t = t.append_column("extra", pa.array(["e"] * t.num_rows))
            if p == 1 and seq == 2:
                t = t.set_column(2, "n", t["n"].cast(pa.int64()))
            pq.write_table(t, d / f"{seq:08d}.parquet", row_group_size=16)
    t = _table(rng, 10, 4, 5, bad=False)
    us = t["_ingest_ts"].cast(pa.int64()).to_pylist()
    (src / "events" / "partition=0" / "00000004.jsonl").write_text(
        "".join(json.dumps({**r, "_ingest_ts": u}) + "\n" for r, u in zip(t.drop_columns(["_ingest_ts"]).to_pylist(), us)))
    (src / "events" / "partition=1" / "00000004.parquet").write_bytes(b"PAR1 not a parquet file PAR1")


def _rows(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.collect())


def test_native_types_and_routing(tmp_path):
    assert native_type(pa.string()) and native_type(pa.timestamp("ms", tz="UTC")) and native_type(pa.int16())
    assert not native_type(pa.timestamp("us")) and not native_type(pa.timestamp("ns", tz="UTC"))
    assert not native_type(pa.list_(pa.int64()))
    _write_sources(tmp_path / "src")
    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner
    job = _job()
    cfg = load_config(env={}, source_uri=(tmp_path / "src").as_uri(), checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                      sink_uri=(tmp_path / "sink").as_uri(), clock_now=CLOCK, epoch_seconds=60)
    r = JobRunner(job, cfg, echo=lambda m: None)
    files = prefix_files(r, job.nodes[0], {0: (5, 0), 1: (5, 0)})
    native, rest = native_files(job.nodes[0], files)
    assert sorted((t[1], t[2]) for t, _ in native) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 3)]
    assert sorted((t[1], t[2]) for t in rest) == [(0, 4), (1, 2), (1, 4)]


@pytest.mark.spark
def test_native_read_equals_the_runtime_reader(tmp_path, monkeypatch):
    """Barriers inside files, a barrier log with an in-file barrier for one partition and none for the other
    (both rules of ``p(x)``), bad records, and the files routed to the runtime's reader: the same rows."""
    _write_sources(tmp_path / "src")
    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner
    job = _job()
    cfg = load_config(env={}, source_uri=(tmp_path / "src").as_uri(), checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                      sink_uri=(tmp_path / "sink").as_uri(), clock_now=CLOCK, epoch_seconds=60)
    r = JobRunner(job, cfg, echo=lambda m: None)
    k0 = T0 // E_US
    n = k0 + 4
    barriers = {"events": {0: (4, 6), 1: (5, 0)}}   # partition 0 stops inside the JSON Lines file
    log = {k0: {"events": {0: (1, 0)}}, k0 + 1: {"events": {0: (1, 25)}},   # an in-file barrier at row 25
           k0 + 2: {"events": {0: (3, 0)}}}                                  # (epoch k0+2 consumed 2 files)
    prefix = Prefix(n, 60, barriers, log)
    source = job.nodes[0]
    monkeypatch.setenv(NATIVE_ENV, "0")
    expected = _rows(source_dataframe(r.spark, r, job, source, prefix))
    monkeypatch.setenv(NATIVE_ENV, "1")
    df = source_dataframe(r.spark, r, job, source, prefix)
    assert "MapInArrow" in df._jdf.queryExecution().optimizedPlan().toString()   # the non-native files
    got = _rows(df)
    assert got == expected
    # 8 Parquet files x 40 rows minus 2 x 3 bad ones, 6 JSON Lines rows; the corrupt file has none
    assert len(got) == 8 * 40 - 6 + 6
    cols = df.columns
    pe = {(row[cols.index("_partition")], row[cols.index("_seq")], row[cols.index("_row")]): row[cols.index("_pepoch")]
          for row in got}
    assert pe[(0, 1, 24)] == k0 + 1 and pe[(0, 1, 25)] == k0 + 2 and pe[(0, 2, 0)] == k0 + 2
    assert pe[(0, 0, 0)] == k0 and pe[(0, 3, 0)] == n
    assert {v for (p, _, _), v in pe.items() if p == 1} == {k0, k0 + 1, k0 + 2, k0 + 3}   # e(x), no log
    # without the runtime's reader at all (only native files): the plan has no Python step
    only = Prefix(n, 60, {"events": {0: (2, 0)}}, log)
    df2 = source_dataframe(r.spark, r, job, source, only)
    assert "MapInArrow" not in df2._jdf.queryExecution().optimizedPlan().toString()
    monkeypatch.setenv(NATIVE_ENV, "0")
    assert _rows(df2) == _rows(source_dataframe(r.spark, r, job, source, only))
