"""A job and a source of the state-equivalence tests' own making (never the demo): deduplicate and event-time
windows, built through the public job API only.

* ``dd``: ``deduplicate`` of the raw events by ``k`` (TTL 90 s, so keys are held, expire and pass again), into the
  append sink ``firsts``;
* ``w``: sliding windows (60 s every 30 s) over the raw events by ``g``, out-of-orderness 20 s, allowed lateness
  30 s, ``emit="final"`` into ``wins`` (watermark channels: the source partitions);
* ``wd``: tumbling 120 s windows over the dedup's output, ``emit="update"`` into the upsert sink ``wins_d``
  (watermark channels: the source partitions, forwarded by the deduplicate); the scenario's restores check that a restore re-emits none of the restored
  epoch's windows (the post-restore check's committed-files suite rejects rows committed twice).

:func:`write_epoch` writes the files of one epoch, so that a test can let data arrive between runs: partition 1
is idle in epoch ``IDLE`` and delivers those rows with the next epoch's file (they are processed one epoch late).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import Job

TS = pa.timestamp("us", tz="UTC")
EVENTS = pa.schema([("k", pa.string()), ("g", pa.string()), ("v", pa.float64()), ("et", TS), ("_ingest_ts", TS)])
E_US = 60_000_000
T0 = 1_780_000_020 // 60 * 60 * 1_000_000   # an epoch boundary (E = 60 s), in microseconds
PARTS, IDLE = 2, 2


def state_job(name: str = "st_dedup_win") -> Job:
    job = Job(name, max_parallelism=16)
    ev = job.source("events", EVENTS)
    firsts = ev.deduplicate(uid="dd", key="k", ttl_seconds=90)
    firsts.sink("firsts")
    ev.window(uid="w", key="g", event_time="et", size_seconds=60, slide_seconds=30, max_out_of_orderness_seconds=20,
              allowed_lateness_seconds=30, aggs={"n": ("count", None), "vs": ("sum", "v"), "vmax": ("max", "v"),
                                                 "ks": ("count_distinct", "k")}, emit="final").sink("wins")
    firsts.window(uid="wd", key="g", event_time="et", size_seconds=120,
                  aggs={"n": ("count", None), "vs": ("sum", "v")}, emit="update").sink("wins_d", mode="upsert")
    return job


def _rows(seed: int, epoch: int, part: int, n: int) -> dict:
    rng = np.random.default_rng(seed * 1000 + epoch * 10 + part)
    ing = np.sort(T0 + epoch * E_US + rng.integers(0, E_US, n))
    keys = rng.integers(0, 12, n)
    return {"k": [f"k{v:02d}" for v in keys], "g": [f"g{v % 3}" for v in keys],
            "v": np.round(rng.uniform(-5, 20, n), 2),
            # event time up to 100 s behind arrival: out of order, some records late for their windows
            "et": ing - rng.integers(0, 100, n) * 1_000_000, "_ingest_ts": ing}


def write_epoch(root: Path, epoch: int, *, seed: int = 7, per_part: int = 12) -> None:
    """The files of ``epoch`` under ``root/events`` (partition 1 skips epoch ``IDLE``: its rows come with the next)."""
    for p in range(PARTS):
        if p == 1 and epoch == IDLE:
            continue
        parts = [_rows(seed, epoch, p, per_part)]
        if p == 1 and epoch == IDLE + 1:
            parts.insert(0, _rows(seed, IDLE, p, per_part))
        t = pa.concat_tables([pa.table(
            {c: (pa.array(r[c], pa.int64()).cast(TS) if c in ("et", "_ingest_ts") else r[c]) for c in EVENTS.names},
            schema=EVENTS) for r in parts])
        d = root / "events" / f"partition={p}"
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(t, d / f"{epoch:08d}.parquet")
