"""A job of the unique-repeat validation test's own making (never the demo): a join with keys declared unique on
both sides whose data repeats a key after its first pair left state, and an aggregate that does not depend on the
join (docs/batch.md "join", ``unique=``).

* ``ub``: ``asks`` inner-joins ``bids`` on ``k``, ``unique="both"`` (matched rows leave state on both sides), into
  the append sink ``deals``;
* ``bidsum``: an aggregate of ``bids`` by ``k`` (count, sum of ``w``) into the upsert sink ``bidsum``: none of its
  rows pass through the join.

Data (60 s epochs, one partition each, two files per source): every key has one ask and one bid in epoch 0 (they
pair and leave state); key ``k1`` gets a second ask in epoch 1. The runtime decides a violation against the rows it
holds: the second ask is no violation (its key left state), it is held, unmatched. The batch evaluation keeps the
first ask of a key over the whole prefix and counts the second one as a violation.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import Job

TS = pa.timestamp("us", tz="UTC")
ASKS = pa.schema([("ask", pa.string()), ("k", pa.string()), ("v", pa.float64()), ("_ingest_ts", TS)])
BIDS = pa.schema([("bid", pa.string()), ("k", pa.string()), ("w", pa.float64()), ("_ingest_ts", TS)])
E = 60
T0 = 1_790_200_000 // E * E


def build() -> Job:
    job = Job("uq_deals", max_parallelism=8)
    asks = job.source("asks", ASKS, key="k")
    bids = job.source("bids", BIDS, key="k")
    asks.join(bids, on="k", uid="ub", unique="both", ttl_seconds=600).sink("deals")
    bids.aggregate(uid="bidsum", key="k", aggs={"n": ("count", None), "w": ("sum", "w")}).sink(
        "bidsum", mode="upsert")
    return job


def write_sources(root: Path, *, keys: int = 6) -> Path:
    us = 1_000_000
    asks0 = [(f"a{i}", f"k{i}", 1.0 + i, (T0 + 5 + 5 * i) * us) for i in range(keys)]
    bids0 = [(f"b{i}", f"k{i}", 2.0 + i, (T0 + 7 + 5 * i) * us) for i in range(keys)]
    asks1 = [("a-repeat", "k1", 9.5, (T0 + E + 10) * us), ("a-late", "k9", 3.0, (T0 + E + 20) * us),
             ("a-end", "k8", 1.0, (T0 + 2 * E + 1) * us)]
    bids1 = [("b-late", "k9", 4.0, (T0 + E + 25) * us), ("b-end", "k7", 1.0, (T0 + 2 * E + 1) * us)]
    for name, schema, files in (("asks", ASKS, (asks0, asks1)), ("bids", BIDS, (bids0, bids1))):
        d = root / name / "partition=0"
        d.mkdir(parents=True, exist_ok=True)
        for seq, rows in enumerate(files):
            cols = {n: [r[i] for r in rows] for i, n in enumerate(schema.names[:3])}
            cols["_ingest_ts"] = pa.array([r[3] for r in rows], TS)
            pq.write_table(pa.table(cols, schema=schema), d / f"{seq:08d}.parquet")
    return root
