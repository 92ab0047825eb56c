"""A job of the round-check tests' own making (never the demo): a deduplicate fed by a join's output, so that in a
lineage with multi-round checkpoints "the first row of its key" is decided per round of the JOIN's emission
(docs/batch.md "deduplicate", :mod:`pipeline.batch.rounds`).

* ``j``: ``a`` left-outer-joins ``b`` on ``k`` (TTL 90 s with 60 s epochs: ``a`` rows without a partner are emitted
  when they expire, in the next epoch's checkpoint), output with ``_ingest_ts`` (a pair's: the later of its two
  rows');
* ``dd``: ``deduplicate`` of the join's output by ``g`` (4 values, TTL 30 s: half an epoch, so each epoch decides
  afresh), into the append sink ``firsts``;
* ``cnt``: an aggregate of the dedup's output by ``g`` into the upsert sink ``counts`` (readers see the newest row
  per key, so rows committed twice are invisible to them: what ``epochal_committed_rows`` is for).

:func:`write_epoch` writes one epoch's files, laid out so that round 1 of a checkpoint holds rows older than
round 0's.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import Job

TS = pa.timestamp("us", tz="UTC")
A = pa.schema([("k", pa.string()), ("g", pa.string()), ("x", pa.float64()), ("_ingest_ts", TS)])
B = pa.schema([("k", pa.string()), ("y", pa.float64()), ("_ingest_ts", TS)])
E_US = 60_000_000
T0 = 1_780_000_020 // 60 * 60 * 1_000_000   # an epoch boundary (E = 60 s), in microseconds
PARTS = 2


def join_dedup_job(name: str = "rc_join_dedup") -> Job:
    job = Job(name, max_parallelism=16)
    a, b = job.source("a", A), job.source("b", B)
    j = a.join(b, on="k", uid="j", how="left", ttl_seconds=90, output=("k", "g", "x", "y", "_ingest_ts"))
    first = j.deduplicate(uid="dd", key="g", ttl_seconds=30)
    first.sink("firsts")
    first.aggregate(uid="cnt", key="g", aggs={"n": ("count", None), "xs": ("sum", "x")}).sink("counts", mode="upsert")
    return job


def write_epoch(root: Path, epoch: int) -> None:
    """Epoch ``epoch``'s files (times in seconds after the epoch's start; at most 8 records per input and round, so
    round 0 reads partition 0's 4 rows and partition 1's first 4, round 1 the rest of partition 1):

    * ``a`` partition 0: 4 late rows (50-56 s) of groups g0/g1; partition 1: 2 rows without a partner (5, 7 s: left
      outer rows emitted when they expire, in round 0 of the next checkpoint), then 12 rows from 30 s on, g2/g3
      first, then every group;
    * ``b``: a partner 1 s before every partnered ``a`` row, in the same partition and order (read in the same
      round), so a pair's ``_ingest_ts`` is its ``a`` row's.

    With the dedup's TTL of 30 s, round 0 passes g0 at 50 s; round 1's g0 at 38 s is then dropped, although it
    is the earlier row of the epoch: a per-epoch rule would keep it instead (the case the round model exists for).
    """
    us = 1_000_000
    t0 = T0 + epoch * E_US
    groups = ["g0", "g1", "g0", "g1"], ["g2", "g3", "g2", "g3"] + ["g0", "g1", "g2", "g3"] * 2
    times = [50, 52, 54, 56], list(range(30, 54, 2))
    for p in range(PARTS):
        ks = [f"k{epoch}-{p}-{i:02d}" for i in range(len(times[p]))]
        lone = [f"k{epoch}-{p}-lone{i}" for i in range(2)] if p == 1 else []
        ta = pa.table({"k": lone + ks, "g": ["g0", "g1"][: len(lone)] + groups[p],
                       "x": [float(i) + 0.25 for i in range(len(lone) + len(ks))],
                       "_ingest_ts": pa.array([t0 + s * us for s in ([5, 7][: len(lone)] + times[p])],
                                              pa.int64()).cast(TS)}, schema=A)
        tb = pa.table({"k": ks, "y": [float(i) * 2 for i in range(len(ks))],
                       "_ingest_ts": pa.array([t0 + (s - 1) * us for s in times[p]], pa.int64()).cast(TS)}, schema=B)
        for src, t in (("a", ta), ("b", tb)):
            d = root / src / f"partition={p}"
            d.mkdir(parents=True, exist_ok=True)
            pq.write_table(t, d / f"{epoch:08d}.parquet")
