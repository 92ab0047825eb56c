"""A job the rest of the suite never uses (``--job tests.cluster.sensors:build``): sensor readings, a running
per-sensor aggregate (upsert sink ``totals``) and a per-sensor aggregate of the hot readings (upsert sink
``hot``), plus its data writer and oracle."""
from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from pipeline import Job
from pipeline.fileio import file_io_for, join_uri
from pipeline.state.backend import table_to_parquet_bytes

_TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("sensor", pa.string()), ("celsius", pa.int64()), ("_ingest_ts", _TS)])
SENSORS = 40
START = datetime(2024, 3, 1, tzinfo=UTC)
EPOCH_SECONDS = 60


def build(max_parallelism: int = 32) -> Job:
    job = Job("sensors", max_parallelism=max_parallelism)
    readings = job.source("readings", SCHEMA, key="sensor")
    readings.filter("celsius >= 30").aggregate(uid="hot_per_sensor", key="sensor",
                                               aggs={"hot_n": ("count", None), "hot_max": ("max", "celsius")}
                                               ).sink("hot", mode="upsert")
    readings.aggregate(uid="per_sensor", key="sensor",
                       aggs={"n": ("count", None), "total": ("sum", "celsius"), "peak": ("max", "celsius")}
                       ).sink("totals", mode="upsert")
    return job


def write(source_root: str, *, epochs: int = 3, partitions: int = 2, rows: int = 300, seed: int = 11) -> pa.Table:
    """``epochs`` epochs of readings in ``partitions`` partitions (one file per partition and epoch); returns
    every row written."""
    rng = np.random.default_rng(seed)
    fio = file_io_for(source_root)
    base_us = int(START.timestamp()) * 1_000_000
    tables = []
    for e in range(epochs):
        for p in range(partitions):
            ts = np.sort(rng.integers(0, EPOCH_SECONDS * 1_000_000, size=rows)) + base_us + e * EPOCH_SECONDS * 1_000_000
            t = pa.table({"sensor": [f"s{int(x):03d}" for x in rng.integers(0, SENSORS, size=rows)],
                          "celsius": pa.array(rng.integers(-10, 45, size=rows), pa.int64()),
                          "_ingest_ts": pa.array(ts, pa.int64()).cast(_TS)}, schema=SCHEMA)
            fio.write_bytes(join_uri(source_root, "readings", f"partition={p}", f"{e:08d}.parquet"),
                            table_to_parquet_bytes(t))
            tables.append(t)
    return pa.concat_tables(tables)


def oracle(rows: pa.Table) -> tuple[list[tuple], list[tuple]]:
    """(sorted hot rows, sorted per-sensor totals) computed directly from the written rows."""
    df = rows.to_pandas()
    h = df[df.celsius >= 30].groupby("sensor").celsius.agg(["count", "max"]).reset_index()
    hot = sorted((r.sensor, int(r["count"]), int(r["max"])) for _, r in h.iterrows())
    g = df.groupby("sensor").celsius.agg(["count", "sum", "max"]).reset_index()
    totals = sorted((r.sensor, int(r["count"]), int(r["sum"]), int(r["max"])) for _, r in g.iterrows())
    return hot, totals
