"""Jobs of the shapes suite's own making (not the demo's): the shapes that need no stateful operator or that put
stateless steps where an operator used to be required (docs/operators.md, "Shapes"). Loaded by the tests in-process
and by ``python -m pipeline run --job shape_jobs:<name>`` in the crash test."""
from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.fileio import file_io_for
from pipeline.job import Job

T0 = datetime(2026, 3, 1, tzinfo=UTC)
E = 10                       # epoch seconds
EPOCHS = 6
PARTS = 2
TS = pa.timestamp("us", tz="UTC")
EVENTS = pa.schema([("id", pa.int64()), ("k", pa.string()), ("g", pa.string()), ("v", pa.float64()),
                    ("et", TS), ("_ingest_ts", TS)])


def stateless() -> Job:
    """source -> filter -> select -> sink; two sources -> union -> sink; upsert sinks of the union; tables
    partitioned by date and minute. Every sink format appears with append and upsert (``PIPELINE_SINK_FORMAT``
    overrides them all)."""
    job = Job("shapes_stateless", max_parallelism=16)
    a = job.source("clicks", EVENTS)
    b = job.source("views", EVENTS)
    a.filter("v > 0").select("id", "k", "v * 100 AS cents").sink("big_clicks", format="delta")
    both = a.union(b.filter("g IS NOT NULL"))
    both.sink("all_events", format="iceberg")
    latest = both.select("k", "id", "v", "_ingest_ts")
    latest.sink("latest_per_key", mode="upsert", key=["k"], format="delta")
    latest.sink("latest_per_key_ice", mode="upsert", key=["k"], format="iceberg")
    latest.sink("latest_per_key_own", mode="upsert", key=["k"], format="epochal")
    by_minute = b.select("id", "k", "date_format(et, 'yyyy-MM-dd') AS dt", "date_format(et, 'HH:mm') AS hm")
    by_minute.sink("views_by_minute", partition_by=["dt", "hm"], format="iceberg")
    by_minute.sink("views_by_minute_d", partition_by=["dt", "hm"], format="delta")
    return job


def mixed() -> Job:
    """Stateless steps after operators, several sinks per operator, a join on two columns and an aggregate of a
    union."""
    job = Job("shapes_mixed", max_parallelism=16)
    a = job.source("clicks", EVENTS)
    b = job.source("views", EVENTS)
    both = a.union(b)
    pairs = a.select("id", "k", "g", "v").join(b.select("id AS vid", "k", "g", "v AS vv"), on=["k", "g"],
                                                  uid="pairs", ttl_seconds=30)
    pairs.select("k", "g", "id", "vid", "v + vv AS total").sink("pair_totals")
    pairs.filter("v > vv").sink("left_bigger")
    totals = both.aggregate(uid="totals", key="k", aggs={"n": ("count", None), "s": ("sum", "v")})
    totals.sink("totals", mode="upsert")
    totals.select("k", "n").sink("counts", mode="upsert", key=["k"])
    return job


def write_sources(root: str, seed: int = 7, epochs: int = EPOCHS, parts: int = PARTS, per_file: int = 6) -> str:
    """Both sources: ``parts`` partitions, one file per epoch and partition, rows in arrival order, keys repeating
    (joins match, upserts replace), some null ``g`` and negative ``v``."""
    rng = random.Random(seed)
    rid = 0
    for name in ("clicks", "views"):
        for p in range(parts):
            for e in range(epochs):
                rows = []
                for i in range(per_file):
                    ing = T0 + timedelta(seconds=e * E + (p + 1) * 0.7 + i * 1.3)
                    rows.append({"id": rid, "k": rng.choice("abcdef"), "g": rng.choice(["x", "y", None]),
                                 "v": float(rng.randint(-3, 9)), "et": ing - timedelta(seconds=rng.randint(0, 3)),
                                 "_ingest_ts": ing})
                    rid += 1
                uri = f"{root}/{name}/partition={p}/{e:08d}.parquet"
                buf = pa.BufferOutputStream()
                pq.write_table(pa.Table.from_pylist(rows, schema=EVENTS), buf)
                file_io_for(uri).write_bytes(uri, buf.getvalue().to_pybytes())
    return root


def read_sources(root: str) -> dict[str, pa.Table]:
    """Every source row (an oracle's input), by source."""
    out = {}
    for name in ("clicks", "views"):
        parts = []
        for p in range(PARTS):
            for e in range(EPOCHS):
                uri = f"{root}/{name}/partition={p}/{e:08d}.parquet"
                with file_io_for(uri).open_input(uri) as f:
                    parts.append(pq.read_table(f))
        out[name] = pa.concat_tables(parts)
    return out
