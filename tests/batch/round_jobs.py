"""A job of the round-check tests' own making (never the demo): a deduplicate fed by a join's output, so that in a
lineage with multi-round checkpoints "the first row of its key" is decided per round of the JOIN's emission
(docs/batch.md "deduplicate", :mod:`pipeline.batch.evaluation.rounds`).

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
import pyarrow.compute as pc
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


# -- a deduplicate fed by a window's output (through a join), multi-round checkpoints ------------------------------
WA = pa.schema([("k", pa.string()), ("et", TS), ("_ingest_ts", TS)])
WB = pa.schema([("k", pa.string()), ("g", pa.string()), ("y", pa.float64()), ("_ingest_ts", TS)])


def window_join_dedup_job(name: str = "rc_window_dedup") -> Job:
    """``w``: a tumbling 30 s ``emit="final"`` window counting ``a`` per ``k`` (event time ``et``, 20 s behind
    arrival), its fired windows also into the append sink ``windows``; ``wj``: the fired windows inner-join ``b``
    on ``k`` (TTL 600 s; a window row's ``_ingest_ts`` is the end of its firing epoch minus 1 µs, a pair's the later
    of its two rows'); ``wd``: ``deduplicate`` of the pairs by ``g`` (TTL 30 s) into the append sink ``wfirsts``."""
    job = Job(name, max_parallelism=16)
    a, b = job.source("a", WA), job.source("b", WB)
    w = a.window(uid="w", key="k", event_time="et", size_seconds=30, aggs={"n": ("count", None)}, emit="final")
    w.sink("windows")
    pairs = w.join(b, on="k", uid="wj", ttl_seconds=600, output=("k", "g", "n", "window_start", "y", "_ingest_ts"))
    pairs.deduplicate(uid="wd", key="g", ttl_seconds=30).sink("wfirsts")
    return job


def write_window_epochs(root: Path) -> None:
    """Epochs 0 and 1 (``S_m`` = start of epoch ``m``; at most 8 records per input and round: checkpoint 1 takes two
    rounds, ``b``'s 16 rows, so the window fires in its round 1):

    * ``a``: epoch 0 ``kA`` at ``S_0``+10 s (event time ``S_0``-10: its window fires in epoch 0), ``kC``, and two
      rows at +55 s (event time +35: ``W(0) = S_0``+35); epoch 1 ``kB`` at +5 s (event time ``S_0``+45, window
      ``[S_0+30, S_1)``, on time against ``W(0)``), fired in epoch 1 by two rows at +50 s (``W(1) = S_1``+30);
    * ``b`` epoch 1, group ``gX``: ``kB`` at +35 s in partition 0 (read in round 0), ``kA`` at +45 s last in
      partition 1 (read in round 1), 14 rows of other keys and groups around them.

    So ``gX`` meets the dedup twice in checkpoint 1, both times in round 1: the pair of ``kA``'s epoch-0 window with
    its round-1 ``b`` row (t = ``S_1``+45 s) and the pair of ``kB``'s window fired in round 1 with its round-0 ``b``
    row (t = ``S_2`` - 1 µs): ``kA``'s passes. With the window's firing round taken as round 0 (not modelled), ``kB``'s
    pair would pass alone in round 0 and ``kA``'s be dropped."""
    us = 1_000_000

    def ts(secs):
        return pa.array([T0 + int(s * us) for s in secs], pa.int64()).cast(TS)

    e = 60
    a_rows = {0: [("kA", 10), ("kF", 55)], 1: [("kC", 20), ("kF2", 55)]}
    a_rows[0] += [("kB", e + 5), ("kG", e + 50)]
    a_rows[1] += [("kH", e + 50)]
    b_rows = {0: [("n0", "gF", e + 5), ("n1", "gF", e + 10), ("n2", "gG", e + 15), ("kB", "gX", e + 35)],
              1: [(f"m{i}", "gF" if i % 2 else "gG", e + 3 + 3 * i) for i in range(11)] + [("kA", "gX", e + 45)]}
    for p in range(PARTS):
        rows = a_rows[p]
        ta = pa.table({"k": [k for k, _ in rows], "et": ts([s - 20 for _, s in rows]),
                       "_ingest_ts": ts([s for _, s in rows])}, schema=WA)
        rb = b_rows[p]
        tb = pa.table({"k": [k for k, _, _ in rb], "g": [g for _, g, _ in rb], "y": [float(i) for i in range(len(rb))],
                       "_ingest_ts": ts([s for _, _, s in rb])}, schema=WB)
        for src, t in (("a", ta), ("b", tb)):
            for epoch in (0, 1):
                lo, hi = T0 + epoch * E_US, T0 + (epoch + 1) * E_US
                us_col = t["_ingest_ts"].cast(pa.int64())
                tt = t.filter(pc.and_(pc.greater_equal(us_col, lo), pc.less(us_col, hi)))
                if not tt.num_rows:
                    continue
                d = root / src / f"partition={p}"
                d.mkdir(parents=True, exist_ok=True)
                pq.write_table(tt, d / f"{epoch:08d}.parquet")
