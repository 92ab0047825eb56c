"""Jobs of the unique-repeat tests' own making (never the demo): ``asks`` joined with ``bids`` on ``k`` with a
``unique`` declaration their data breaks in every way the kernel distinguishes (docs/batch.md "join", ``unique=``):
a repeat after the key's first row paired (and left state when the partner side is unique), after it expired (TTL),
while it is held, twice in one round, and in a later round of the same backlogged epoch with an older
``_ingest_ts``; on the left and on the right. 60 s epochs, one partition per source, one file per epoch.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import Job

TS = pa.timestamp("us", tz="UTC")
ASKS = pa.schema([("ask", pa.string()), ("k", pa.string()), ("v", pa.float64()), ("_ingest_ts", TS)])
BIDS = pa.schema([("bid", pa.string()), ("k", pa.string()), ("w", pa.float64()), ("_ingest_ts", TS)])
ASKS_AT = pa.schema([*ASKS, pa.field("at", TS)])   # with an event-time column (the ask's time) for a window
E = 60
T0 = 1_790_200_000 // E * E


# -- shapes: every way a key repeats on a unique side (tests/batch/test_unique_repeats.py) -------------------------
TTL_SHAPES = 150       # s: a row of epoch 0 at t < T0 + 30 s expires in epoch 2 (cutoff end(m) - ttl)


def build_shapes(unique: str, how: str = "inner", name: str = "uq_shapes", *, window: bool = False) -> Job:
    """``asks`` ``how``-joins ``bids`` on ``k`` with ``unique``, TTL 150 s, into the append sink ``pairs``; an
    aggregate of the pairs by ``k`` into the upsert sink ``per_k`` (downstream of the join: checked through it).
    ``window``: also a 60 s tumbling window of the pairs per ``k`` (its watermark from both inputs' channels, so the
    join's rows carry their channel sets through the repeats' fold)."""
    job = Job(name, max_parallelism=8)
    asks = job.source("asks", ASKS_AT if window else ASKS, key="k")
    bids = job.source("bids", BIDS, key="k")
    pairs = asks.join(bids, on="k", uid="uj", how=how, unique=unique, ttl_seconds=TTL_SHAPES)
    pairs.sink("pairs")
    pairs.aggregate(uid="per_k", key="k", aggs={"n": ("count", None)}).sink("per_k", mode="upsert")
    if window:
        pairs.window(uid="per_min", key="k", event_time="at", size_seconds=E, max_out_of_orderness_seconds=5,
                     aggs={"n": ("count", None)}).sink("per_min")
    return job


# (name, key, value, seconds after T0) in file order; one file per epoch, partition 0. With max_records_per_epoch=4
# an epoch of more than 4 rows of a source takes several rounds (rounds cut by position: 4 rows each).
SHAPE_ASKS = [
    # epoch 0, round 0: k4 twice in ONE round (the older _ingest_ts first, whatever the position)
    [("a4a", "k4", 1.0, 20), ("a4b", "k4", 2.0, 12), ("a1", "k1", 3.0, 5), ("a2", "k2", 4.0, 6),
     # round 1
     ("a3", "k3", 5.0, 7), ("a5", "k5", 6.0, 8), ("a6", "k6", 7.0, 9)],
    # epoch 1: k7 in round 0 (t 100) and again in round 1 with an OLDER t (70): the round decides, not t;
    # k1 again after its first ask paired; k3 again while its first ask is held unmatched
    [("a7a", "k7", 8.0, 100), ("a1r", "k1", 9.0, 65), ("a3r", "k3", 10.0, 66), ("f1", "f1", 0.0, 61),
     ("f2", "f2", 0.0, 62), ("f3", "f3", 0.0, 63), ("a7b", "k7", 11.0, 70)],
    [("a8", "k8", 12.0, 130)],                                             # epoch 2
    # epoch 3: k2 again after its first ask expired (TTL); k3 a third time
    [("a2r", "k2", 13.0, 190), ("a3s", "k3", 14.0, 200)],
    [("a9", "k9", 15.0, 250)],                                             # epoch 4
    [("a-end", "kz", 0.0, 301)],                                           # epoch 5: closes barrier 4
]
SHAPE_BIDS = [
    [("b4a", "k4", 1.0, 25), ("b4b", "k4", 2.0, 22), ("b1", "k1", 3.0, 10), ("b5a", "k5", 4.0, 11),
     ("b6", "k6", 5.0, 12)],
    [("b5b", "k5", 6.0, 67), ("b7", "k7", 7.0, 101), ("b3", "k3", 8.0, 80)],
    [("b8", "k8", 9.0, 131), ("b8r", "k8", 10.0, 135)],
    [("b2", "k2", 11.0, 191), ("b1r", "k1", 12.0, 185)],
    [("b9", "k9", 13.0, 251), ("b2r", "k2", 14.0, 252)],
    [("b-end", "kz", 0.0, 301)],
]
SHAPE_EPOCHS = 5       # epochs 0..4 (the rows of epoch 5 complete barrier 4)


def write_shapes(root: Path, *, tie: bool = False, window: bool = False) -> Path:
    """The shapes' sources (``tie``: one more ask of ``k6`` in epoch 0's second round with ``a6``'s ``_ingest_ts`` - the
    kernel then orders by the other columns in column order: ``ask`` "a6" < "a6t")."""
    us = 1_000_000
    asks = [list(f) for f in SHAPE_ASKS]
    if tie:
        asks[0].append(("a6t", "k6", 0.5, 9))
    for name, schema, files in (("asks", ASKS_AT if window else ASKS, asks), ("bids", BIDS, SHAPE_BIDS)):
        d = root / name / "partition=0"
        d.mkdir(parents=True, exist_ok=True)
        for seq, rows in enumerate(files):
            cols = {n: [r[i] for r in rows] for i, n in enumerate(schema.names[:3])}
            cols["_ingest_ts"] = pa.array([(T0 + r[3]) * us for r in rows], TS)
            if "at" in schema.names:
                cols["at"] = cols["_ingest_ts"]
            pq.write_table(pa.table(cols, schema=schema), d / f"{seq:08d}.parquet")
    return root
