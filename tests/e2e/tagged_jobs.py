"""Jobs and a source of the epoch-tagging tests' own making (tests/integration/test_epoch_tagging.py and
tests/e2e/test_epoch_tagging_crash.py): deduplicate -> left join with TTL -> running aggregate, an append and an
upsert sink (:func:`tagged_job`); a sliding event-time window with late records and an aggregate chained over it
(:func:`window_job`). ``python -m pipeline run --job tagged_jobs:tagged_job`` with tests/e2e on ``PYTHONPATH``."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.job import Job

TS = pa.timestamp("us", tz="UTC")
VIEWS = pa.schema([("vid", pa.string()), ("user", pa.string()), ("_ingest_ts", TS)])
BUYS = pa.schema([("bid", pa.string()), ("vid", pa.string()), ("amount", pa.int64()), ("_ingest_ts", TS)])
T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
EPOCHS, PER_EPOCH = 5, 40


def tagged_job(windows: bool = False) -> Job:
    """``windows``: also the branch of :func:`window_job` over the same views (one job, both kinds of operators)."""
    job = Job("tagged_rounds", max_parallelism=16)
    views = job.source("views", VIEWS, key="vid")
    buys = job.source("buys", BUYS, key="vid")
    seen = views.deduplicate(uid="seen", key="vid", ttl_seconds=150)
    j = seen.join(buys.select("vid", "amount"), on="vid", uid="j", how="left", ttl_seconds=150)
    j.sink("joined")
    j.aggregate(uid="per-user", key="user", aggs={"n": ("count", None), "total": ("sum", "amount")}).sink(
        "user_totals", mode="upsert", key=["user"])
    if windows:
        _windows(views)
    return job


def _windows(views) -> None:
    w = views.select("vid", "user", "length(vid) AS len",
                     "timestamp_micros(unix_micros(_ingest_ts) - pmod(hash(vid), 150000000)) AS et").window(
        uid="w", key="user", event_time="et", size_seconds=60, slide_seconds=30, max_out_of_orderness_seconds=15,
        allowed_lateness_seconds=10, aggs={"n": ("count", None), "chars": ("sum", "len"), "longest": ("max", "len")})
    w.sink("user_windows")
    w.aggregate(uid="windows-per-user", key="user", aggs={"windows": ("count", None), "views": ("sum", "n")}).sink(
        "window_totals", mode="upsert", key=["user"])


def window_job() -> Job:
    """Views per user in sliding event-time windows (60 s, sliding by 30 s): event times run up to 150 s behind the
    ingest time, so records arrive out of order and some late (dead letters); an aggregate counts the fired
    windows per user (chained: the window's output flows on)."""
    job = Job("tagged_windows", max_parallelism=16)
    _windows(job.source("views", VIEWS, key="vid"))
    return job


def write_source(root: Path) -> str:
    for e in range(EPOCHS):
        for p in range(2):
            n = PER_EPOCH // 2
            vids = [f"v{e}-{p}-{i}" for i in range(n)]
            vids[:2] = [f"v{max(0, e - 1)}-{p}-{i}" for i in range(2)]  # repeats of the previous epoch: dropped
            d = root / "views" / f"partition={p}"
            d.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"vid": vids, "user": [f"u{(i * 5 + e) % 7}" for i in range(n)],
                                     "_ingest_ts": [T0 + timedelta(seconds=60 * e + 55 * i / n) for i in range(n)]},
                                    schema=VIEWS), d / f"{e:08d}.parquet")
            # buys of views of this or the previous epochs (some never: unmatched views leave at expiry)
            src = [(max(0, e - (i % 3)), (p + i) % 2, (i * 3) % n) for i in range(0, n, 2)]
            d = root / "buys" / f"partition={p}"
            d.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"bid": [f"b{e}-{p}-{i}" for i in range(len(src))],
                                     "vid": [f"v{a}-{b}-{c}" for a, b, c in src],
                                     "amount": [i * 7 % 50 + 1 for i in range(len(src))],
                                     "_ingest_ts": [T0 + timedelta(seconds=60 * e + 50 * i / len(src))
                                                    for i in range(len(src))]}, schema=BUYS),
                           d / f"{e:08d}.parquet")
    return root.as_uri()


