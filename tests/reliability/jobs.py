"""Small jobs of the reliability tests' own making (public job API only) and a writer of source files
whose rows span several epochs."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.job import Job

EVENTS_SCHEMA = pa.schema([pa.field("event_id", pa.string()), pa.field("user", pa.string()),
                           pa.field("value", pa.int64()), pa.field("_ingest_ts", pa.timestamp("us", tz="UTC"))])
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def counts_job() -> Job:
    """Per-user running count and sum of ``value`` (upsert sink)."""
    job = Job("rel_counts", max_parallelism=16)
    ev = job.source("events", EVENTS_SCHEMA, key="event_id")
    ev.aggregate(uid="per-user", key="user", aggs={"n": ("count", None), "total": ("sum", "value")}) \
        .sink("user_totals", mode="upsert", key=["user"])
    return job


def write_events(src: Path, partition: int, seq: int, rows: list[tuple[str, str, int, float]]) -> Path:
    """rows: (event_id, user, value, seconds after T0)."""
    d = src / "events" / f"partition={partition}"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{seq:08d}.parquet"
    tbl = pa.table({"event_id": [r[0] for r in rows], "user": [r[1] for r in rows],
                    "value": [r[2] for r in rows],
                    "_ingest_ts": [T0 + timedelta(seconds=r[3]) for r in rows]}, schema=EVENTS_SCHEMA)
    pq.write_table(tbl, path)
    return path


def spanning_rows(seq: int, n: int, start_s: float, step_s: float, users: int = 5) -> list:
    return [(f"e{seq}-{i}", f"u{i % users}", i + 1, start_s + i * step_s) for i in range(n)]


def events_table(rows: list[tuple[str, str, int, float]]) -> pa.Table:
    return pa.table({"event_id": [r[0] for r in rows], "user": [r[1] for r in rows],
                     "value": [r[2] for r in rows],
                     "_ingest_ts": [T0 + timedelta(seconds=r[3]) for r in rows]}, schema=EVENTS_SCHEMA)


def put_events(src_uri: str, partition: int, seq: int, rows: list[tuple[str, str, int, float]]) -> str:
    """Like :func:`write_events` on any storage (``s3://`` or ``file://``), through FileIO."""
    import io

    from pipeline.fileio import file_io_for
    buf = io.BytesIO()
    pq.write_table(events_table(rows), buf)
    uri = f"{src_uri.rstrip('/')}/events/partition={partition}/{seq:08d}.parquet"
    file_io_for(uri).write_bytes(uri, buf.getvalue())
    return uri


def totals_oracle(rows) -> dict[str, tuple[int, int]]:
    """Per-user (count, sum of value): what ``counts_job`` must end with, each row counted once."""
    out: dict[str, tuple[int, int]] = {}
    for _eid, user, value, _t in rows:
        n, t = out.get(user, (0, 0))
        out[user] = (n + 1, t + (value or 0))  # count(*) counts every row, sum skips nulls (SQL)
    return out
