"""The job and data the S3 request tests share (``test_s3_requests.py``, ``test_s3_requests_outside_rounds.py``):
``clicks -> aggregate per user -> upsert sink``, one Parquet file per partition and epoch, and the difference
of two readings of a counting proxy."""
from __future__ import annotations

import io
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.fileio import S3FileIO
from pipeline.fileio.request_counter import KINDS, StorageRequests
from pipeline.job import Job

SCHEMA = pa.schema([pa.field("click_id", pa.string()), pa.field("user", pa.string()),
                    pa.field("value", pa.int64()), pa.field("_ingest_ts", pa.timestamp("us", tz="UTC"))])


def clicks_job(name: str, fmt: str | None = None) -> Job:
    job = Job(name, max_parallelism=8)
    job.source("clicks", SCHEMA, key="click_id") \
        .aggregate(uid="per-user", key="user", aggs={"n": ("count", None), "total": ("sum", "value")}) \
        .sink("user_totals", mode="upsert", key=["user"], **({"format": fmt} if fmt else {}))
    return job


def write_clicks_epoch(fio: S3FileIO, src: str, e: int, *, t0: datetime, rows: int, users: int,
                       step_s: int) -> None:
    """Epoch ``e``'s file of each of the 2 partitions: ``rows`` clicks of ``users`` users, ``step_s`` apart."""
    for p in range(2):
        t = pa.table({"click_id": [f"{e}-{p}-{i}" for i in range(rows)], "user": [f"u{i % users}" for i in range(rows)],
                      "value": list(range(rows)),
                      "_ingest_ts": [t0 + timedelta(seconds=60 * e + step_s * i) for i in range(rows)]}, schema=SCHEMA)
        buf = io.BytesIO()
        pq.write_table(t, buf)
        fio.write_bytes(f"{src}/clicks/partition={p}/{e:08d}.parquet", buf.getvalue())


def proxy_diff(before: dict, after: dict) -> StorageRequests:
    """The requests a proxy saw between two readings of its counts (only the five kinds exist here)."""
    diff = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    assert diff.get("other", 0) == 0, diff
    return StorageRequests(**{k: diff.get(k, 0) for k in KINDS})
