"""The job of the ``run --follow`` tests (tests/e2e/test_follow.py), of their own making: clicks per user, an append
sink of every click and a running aggregate per user into an upsert sink. Two source partitions, one Parquet file
per epoch and partition, written by the test while the follower runs (:func:`write_epoch`).

``python -m pipeline run --follow --job follow_jobs:clicks_job`` with tests/e2e on ``PYTHONPATH``.
"""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.job import Job

TS = pa.timestamp("us", tz="UTC")
CLICKS = pa.schema([("cid", pa.string()), ("user", pa.string()), ("amount", pa.int64()), ("_ingest_ts", TS)])
T0 = datetime(2025, 6, 1, tzinfo=UTC)
E = 10          # epoch seconds
PARTS = 2
PER_FILE = 12


def clicks_job() -> Job:
    job = Job("follow_clicks", max_parallelism=16)
    clicks = job.source("clicks", CLICKS, key="user")
    clicks.sink("clicks_out")
    clicks.aggregate(uid="per_user", key="user", aggs={"n": ("count", None), "total": ("sum", "amount")}).sink(
        "user_totals", mode="upsert", key=["user"])
    return job


def epoch_of_t0() -> int:
    return int(T0.timestamp()) // E


def write_epoch(root: Path, k: int, parts: range | list[int] = range(PARTS)) -> None:
    """The ``k``-th epoch's file of each partition in ``parts`` (``_ingest_ts`` within that epoch, rising); written
    to a temporary name and renamed, so a listing never sees a half-written file."""
    for p in parts:
        d = root / "clicks" / f"partition={p}"
        d.mkdir(parents=True, exist_ok=True)
        rows = {"cid": [f"c{k}-{p}-{i}" for i in range(PER_FILE)],
                "user": [f"u{(i * 3 + k + p) % 5}" for i in range(PER_FILE)],
                "amount": [(i * 7 + k * 3 + p) % 20 + 1 for i in range(PER_FILE)],
                "_ingest_ts": [T0 + timedelta(seconds=k * E + p * 0.5 + i * 0.7) for i in range(PER_FILE)]}
        tmp = d / f".{k:08d}.parquet.tmp"
        pq.write_table(pa.table(rows, schema=CLICKS), tmp)
        tmp.rename(d / f"{k:08d}.parquet")


def source_rows(root: Path) -> pd.DataFrame:
    return pd.concat([pq.read_table(f).to_pandas() for f in sorted((root / "clicks").glob("partition=*/*.parquet"))])


def oracle(rows: pd.DataFrame) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """What the committed sinks must hold after ``rows``: every click id once, and per user (count, sum)."""
    g = rows.groupby("user").agg(n=("cid", "count"), total=("amount", "sum"))
    return sorted(rows.cid), {u: (int(r.n), int(r.total)) for u, r in g.iterrows()}
