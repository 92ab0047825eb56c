#!/usr/bin/env python3
"""Micro-benchmark of the interval join and temporal join kernels (``pipeline.operators.interval_join``,
``pipeline.operators.temporal_join``; no Spark) as the held state grows: events/s of one subtask's round and the
state-scale question (docs/performance.md: a round should cost at most 1.2x at 30x the state).

    .venv/bin/python benchmarks/timed_join_bench.py    # 20k rows a round (both sides) over 2,000 keys, best of 5

A round: ``--rows`` new rows (half per side) over ``--touched`` keys, the watermark advancing by one epoch, against a
held state of ``K`` keys (1x .. 30x; each key holding the rows still inside the bounds / the versions above the
watermark). Two figures per size:

* ``heap``: the kernel over the subtask's whole state (what the heap backend does: its cost grows with the state);
* ``keyed``: the kernel over the touched keys' rows only (what the rocksdb backend reads: the keys with input and
  the keys whose rows leave at the watermark), which is the per-checkpoint cost as the state grows.

Prints the round's time, events/s, the ratio to the smallest state, and the load average before and after.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipeline.operators.interval_join import IntervalJoinSpec, interval_join_step  # noqa: E402
from pipeline.operators.temporal_join import TemporalJoinSpec, temporal_join_step  # noqa: E402

TS = pa.timestamp("us", tz="UTC")
SEC = 1_000_000
EPOCH = 60 * SEC


def side(keys: np.ndarray, times: np.ndarray, prefix: str, rng) -> pa.Table:
    n = len(keys)
    return pa.table({"k": pa.array(keys, pa.int64()), f"{prefix}t": pa.array(times, TS),
                     f"{prefix}v": pa.array(rng.integers(0, 1_000_000, n)),
                     "_kg": pa.array(keys % 128, pa.int32())})


def versions(keys: np.ndarray, times: np.ndarray, rng) -> pa.Table:
    t = side(keys, times, "r", rng)
    return t.append_column("_ingest_ts", pa.array(times + 1, TS))


def touched(state: pa.Table, new: pa.Table) -> pa.Table:
    return state.filter(pc.is_in(state["k"], value_set=pc.unique(new["k"])))


def interval_round(args, scale: int, rng, keyed: bool) -> float:
    spec = IntervalJoinSpec("k", "lt", "rt", -5 * SEC, 20 * SEC, ("_kg",))
    keys = args.touched * scale
    w0 = 10 * EPOCH
    per = 6   # held rows per key and side: the last 25 s of rows
    held_l = side(np.repeat(np.arange(keys), per), w0 - 20 * SEC + rng.integers(0, 30 * SEC, keys * per), "l", rng)
    held_r = side(np.repeat(np.arange(keys), per), w0 + rng.integers(0, 10 * SEC, keys * per), "r", rng)
    h = args.rows // 2
    new_l = side(rng.integers(0, args.touched, h), w0 + rng.integers(1, EPOCH, h), "l", rng)
    new_r = side(rng.integers(0, args.touched, h), w0 + rng.integers(1, EPOCH, h), "r", rng)
    if keyed:   # the rocksdb backend's read: the keys with input (the leaving keys are a range scan of the index)
        held_l, held_r = touched(held_l, pa.concat_tables([new_l.select(["k"]), new_r.select(["k"])])), touched(
            held_r, pa.concat_tables([new_l.select(["k"]), new_r.select(["k"])]))
    t0 = time.perf_counter()
    interval_join_step(spec, held_l, held_r, new_l, new_r, late_watermark_us=w0, watermark_us=w0 + EPOCH - 10 * SEC)
    return time.perf_counter() - t0


def temporal_round(args, scale: int, rng, keyed: bool) -> float:
    spec = TemporalJoinSpec("k", "lt", "rt", "left", ("_kg",))
    keys = args.touched * scale
    w0 = 10 * EPOCH
    held_l = side(np.repeat(np.arange(keys), 2), w0 + rng.integers(1, 10 * SEC, keys * 2), "l", rng)
    # per key: the version valid at the watermark and two above it
    held_r = versions(np.repeat(np.arange(keys), 3), w0 + np.tile([-30 * SEC, 5 * SEC, 40 * SEC], keys), rng)
    h = args.rows // 2
    new_l = side(rng.integers(0, args.touched, h), w0 + rng.integers(1, EPOCH, h), "l", rng)
    new_r = versions(rng.integers(0, args.touched, h // 20), w0 + rng.integers(1, EPOCH, h // 20), rng)
    if keyed:
        ks = pa.concat_tables([new_l.select(["k"]), new_r.select(["k"])])
        held_l, held_r = touched(held_l, ks), touched(held_r, ks)
    t0 = time.perf_counter()
    temporal_join_step(spec, held_l, held_r, new_l, new_r, late_watermark_us=w0, watermark_us=w0 + EPOCH - 10 * SEC)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--touched", type=int, default=2_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"load before: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    for name, fn in (("interval join", interval_round), ("temporal join", temporal_round)):
        for keyed in (False, True):
            base = None
            fn(args, 1, np.random.default_rng(7), keyed)   # warm-up (imports, allocator)
            for scale in (1, 3, 10, 30):
                rng = np.random.default_rng(7)
                best = min(fn(args, scale, rng, keyed) for _ in range(args.repeat))
                base = base or best
                print(f"{name:13s} {'keyed' if keyed else 'heap ':5s} state {args.touched * scale:>7,} keys: "
                      f"round {best * 1000:7.1f} ms ({args.rows / best:>9,.0f} events/s), {best / base:.2f}x")
    print(f"load after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


if __name__ == "__main__":
    main()
