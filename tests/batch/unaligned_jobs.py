"""A job of the unaligned-validation test's own making (never the demo), and its data: a join feeding an append
sink and an aggregate into an upsert sink, with a backlog in one partition so that unaligned checkpoints complete
with pending source ranges (docs/alignment.md "What happens under a backlog").

* ``cv``: ``clicks`` inner-joins ``views`` on ``ad`` (TTL 150 s, 60 s epochs), output to the append sink ``pairs``;
* ``spend``: an aggregate of the pairs by ``ad`` (count, sum of ``cost``) into the upsert sink ``spend``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import Job

TS = pa.timestamp("us", tz="UTC")
CLICKS = pa.schema([("click", pa.string()), ("ad", pa.string()), ("cost", pa.float64()), ("_ingest_ts", TS)])
VIEWS = pa.schema([("view", pa.string()), ("ad", pa.string()), ("_ingest_ts", TS)])
E = 60
T0 = 1_790_000_000 // E * E          # an epoch boundary, seconds


def build() -> Job:
    job = Job("ua_spend", max_parallelism=16)
    clicks = job.source("clicks", CLICKS, key="ad")
    views = job.source("views", VIEWS, key="ad")
    pairs = clicks.join(views, on="ad", uid="cv", ttl_seconds=150, output=("ad", "click", "view", "cost"))
    pairs.sink("pairs")
    pairs.aggregate(uid="spend", key="ad", aggs={"n": ("count", None), "total": ("sum", "cost")}).sink(
        "spend", mode="upsert")
    return job


def write_sources(root: Path, *, epochs: int = 5, clicks: int = 50, views: int = 60, burst: int = 100,
                  burst_epoch: int = 1, seed: int = 5) -> Path:
    """Clicks (2 partitions) and views (2) on 8 ads over ``epochs`` epochs, plus ``burst`` clicks in partition 0
    during ``burst_epoch``: with a small ``PIPELINE_MAX_RECORDS_PER_EPOCH`` that partition lags behind its barriers
    and unaligned checkpoints record its unread pre-barrier rows as pending source ranges."""
    rng = np.random.default_rng(seed)
    span = epochs * E * 1_000_000
    ads = [f"ad{i}" for i in range(8)]
    for name, schema, n in (("clicks", CLICKS, clicks), ("views", VIEWS, views)):
        parts: dict[int, list] = {0: [], 1: []}
        for i in range(n):
            t = T0 * 1_000_000 + int(rng.integers(span))
            parts[int(rng.integers(2))].append((f"{name[0]}{i}", ads[int(rng.integers(len(ads)))], t))
        if name == "clicks":
            t_b = (T0 + burst_epoch * E) * 1_000_000
            parts[0] += [(f"b{i}", ads[int(rng.integers(3))], t_b + int(rng.integers(E * 1_000_000)))
                         for i in range(burst)]
        for p, rows in parts.items():
            rows.sort(key=lambda r: r[2])
            d = root / name / f"partition={p}"
            d.mkdir(parents=True, exist_ok=True)
            half = len(rows) // 2
            for seq, chunk in enumerate((rows[:half], rows[half:])):
                cols = {schema.names[0]: [r[0] for r in chunk], "ad": [r[1] for r in chunk]}
                if name == "clicks":
                    cols["cost"] = [round(0.05 + (int(r[0][1:]) % 17) * 0.13, 2) for r in chunk]
                cols["_ingest_ts"] = pa.array([r[2] for r in chunk], TS)
                pq.write_table(pa.table(cols, schema=schema), d / f"{seq:08d}.parquet")
    return root


# -- a deduplicate of a source whose backlog unaligned checkpoints drain ------------------------------------------
UROWS = pa.schema([("g", pa.string()), ("v", pa.float64()), ("_ingest_ts", TS)])


def drain_dedup_job(name: str = "ua_drain_dedup") -> Job:
    """``ud``: ``deduplicate`` of source ``u`` by ``g`` (TTL 120 s, two epochs), into the append sink ``ufirsts``;
    ``uc``: an aggregate of the same source (rows per ``g``) into the upsert sink ``ucounts`` - like the dedup, it
    consumes the rows an unaligned snapshot parks (only a join does not)."""
    job = Job(name, max_parallelism=16)
    u = job.source("u", UROWS)
    u.deduplicate(uid="ud", key="g", ttl_seconds=120).sink("ufirsts")
    u.aggregate(uid="uc", key="g", aggs={"n": ("count", None)}).sink("ucounts", mode="upsert")
    return job


def write_drain_sources(root: Path) -> Path:
    """Partition 0: a burst of 30 rows in epoch 1 - 20 rows of keys of their own, then groups ``g0..g3`` (10 rows, 40-58
    s into the epoch) - and one row in each of epochs 0, 2, 3; partition 1: a few rows every epoch 0-4, among them
    ``g0..g3`` at 5-8 s into epoch 2. With at most 8 records per round and unaligned checkpoints, partition 1 reaches
    each barrier in round 0 and the burst drains over the checkpoints of epochs 1-5: partition 1's ``g`` rows (own
    epoch 2) are consumed before the burst's (own epoch 1), so the runtime passes them and drops the burst's (a held
    row of epoch 2 covers an epoch-1 row: ``t >= end(1) - 120 s``); in own-epoch order the burst's would pass instead."""
    us = 1_000_000
    rows: dict[int, list[tuple[str, int]]] = {
        0: [("a0", 10)] + [(f"f{i:02d}", E + 1 + i) for i in range(20)]
           + [(f"g{i % 4}", E + 40 + 2 * i) for i in range(10)] + [("a2", 2 * E + 10), ("a3", 3 * E + 10)],
        1: [("b0", 15), ("b1", 25), ("gA", E + 5), ("gB", E + 10)] + [(f"g{i}", 2 * E + 5 + i) for i in range(4)]
           + [("b3", 3 * E + 5), ("b4", 4 * E + 5)],
    }
    for p, rs in rows.items():
        d = root / "u" / f"partition={p}"
        d.mkdir(parents=True, exist_ok=True)
        by_epoch: dict[int, list] = {}
        for g, s in rs:
            by_epoch.setdefault(s // E, []).append((g, s))
        for seq, (_e, chunk) in enumerate(sorted(by_epoch.items())):
            pq.write_table(pa.table({"g": [g for g, _ in chunk], "v": [float(s) for _, s in chunk],
                                     "_ingest_ts": pa.array([(T0 + s) * us for _, s in chunk], TS)}, schema=UROWS),
                           d / f"{seq:08d}.parquet")
    return root
