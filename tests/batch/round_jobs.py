"""A job of the round-check tests' own making (never the demo): a deduplicate fed by a join's output, so that in a
lineage with multi-round checkpoints "the first row of its key" is decided per round of the JOIN's emission
(docs/batch.md "deduplicate", :mod:`pipeline.batch.rounds`).

* ``j``: ``a`` left-outer-joins ``b`` on ``k`` (TTL 90 s with 60 s epochs: pairs across neighbouring epochs, lonely
  ``a`` rows emitted on arrival or when they expire one epoch later), output with ``_ingest_ts`` (a pair's: the later
  of its two rows');
* ``dd``: ``deduplicate`` of the join's output by ``g`` (4 values, TTL 150 s: keys are held, expire, pass again),
  into the append sink ``firsts``;
* ``cnt``: an aggregate of the dedup's output by ``g`` into the upsert sink ``counts`` (readers see the newest row
  per key, so rows committed twice are invisible to them: what ``epochal_committed_rows`` is for).

:func:`write_epoch` writes one epoch's files: per partition rows spread over the epoch, partition 1 of ``a``
denser early (so that round 1 of a checkpoint holds rows older than round 0's).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
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
    first = j.deduplicate(uid="dd", key="g", ttl_seconds=150)
    first.sink("firsts")
    first.aggregate(uid="cnt", key="g", aggs={"n": ("count", None), "xs": ("sum", "x")}).sink("counts", mode="upsert")
    return job


def write_epoch(root: Path, epoch: int, *, seed: int = 11, per_part: int = 14) -> None:
    rng = np.random.default_rng(seed * 100 + epoch)
    for p in range(PARTS):
        n = per_part
        # partition 1 of ``a`` is dense in the epoch's first half: its round-1 rows are older than partition 0's
        # round-0 rows
        span = E_US // 2 if p == 1 else E_US
        ing = np.sort(T0 + epoch * E_US + rng.integers(0, span, n))
        ids = rng.choice(40, n, replace=False)
        ta = pa.table({"k": [f"k{epoch}-{i:02d}" for i in ids], "g": [f"g{i % 4}" for i in ids],
                       "x": np.round(rng.uniform(0, 50, n), 2), "_ingest_ts": pa.array(ing, pa.int64()).cast(TS)},
                      schema=A)
        # b: partners for most of them, and two keys of the previous epoch (pairs across epochs, when a has them)
        kb = [f"k{epoch}-{i:02d}" for i in ids[: n - 3]] + [f"k{epoch - 1}-{i:02d}" for i in rng.choice(40, 2)]
        ingb = np.sort(T0 + epoch * E_US + rng.integers(0, E_US, len(kb)))
        tb = pa.table({"k": kb, "y": np.round(rng.uniform(0, 9, len(kb)), 2),
                       "_ingest_ts": pa.array(ingb, pa.int64()).cast(TS)}, schema=B)
        for src, t in (("a", ta), ("b", tb)):
            d = root / src / f"partition={p}"
            d.mkdir(parents=True, exist_ok=True)
            pq.write_table(t, d / f"{epoch:08d}.parquet")
