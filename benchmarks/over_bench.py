#!/usr/bin/env python3
"""Micro-benchmark of the over aggregate kernel (``pipeline.operators.over_aggregate``; no Spark) as the held state
grows: events/s of one subtask's round and the state-scale question (docs/performance.md: a round should cost at
most 1.2x at 30x the state).

    .venv/bin/python benchmarks/over_bench.py    # 20k rows a round over 2,000 keys, ROWS 10 PRECEDING, best of 5

A round: ``--rows`` new rows over ``--touched`` keys, the watermark advancing by one epoch (the round's rows fire),
against a held state of ``K`` keys (1x .. 30x), each holding its last ``--preceding`` fired rows (what a ROWS frame
keeps). Two figures per size:

* ``heap``: the kernel over the subtask's whole state (what the heap backend reads; the kernel works on the keys
  with rows to fire only, the others' rows pass through);
* ``keyed``: the kernel over the touched keys' rows only (what the rocksdb backend reads), the per-checkpoint cost
  as the state grows.

Prints the round's time, events/s, the ratio to the smallest state, and the load average before and after."""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipeline.operators.over_aggregate import FIRED, OverSpec, over_retract_step, over_step  # noqa: E402

TS = pa.timestamp("us", tz="UTC")
SEC = 1_000_000
EPOCH = 60 * SEC


def rows(keys: np.ndarray, times: np.ndarray, rng, fired: bool | None) -> pa.Table:
    n = len(keys)
    t = pa.table({"k": pa.array(keys, pa.int64()), "t": pa.array(times, TS),
                  "price": pa.array(rng.integers(0, 1_000_000, n)), "_kg": pa.array(keys % 128, pa.int32())})
    return t if fired is None else t.append_column(FIRED, pa.repeat(pa.scalar(fired), n))


def one_round(args, scale: int, rng, keyed: bool) -> float:
    spec = OverSpec("k", "t", (("avg_price", "avg", "price"), ("n", "count", None)), rows=args.preceding,
                    internal=("_kg",))
    keys = args.touched * scale
    w0 = 10 * EPOCH
    held = rows(np.repeat(np.arange(keys), args.preceding),
                w0 - rng.integers(0, 5 * EPOCH, keys * args.preceding), rng, True)
    new = rows(rng.integers(0, args.touched, args.rows), w0 + rng.integers(1, EPOCH, args.rows), rng, None)
    if keyed:
        held = held.filter(pc.is_in(held["k"], value_set=pc.unique(new["k"])))
    t0 = time.perf_counter()
    res = over_step(spec, held, new, late_watermark_us=w0, watermark_us=w0 + EPOCH)
    dt = time.perf_counter() - t0
    assert res.output.num_rows == args.rows
    return dt


def retract_round(args, scale: int, rng) -> float:
    """Over an updating stream (q6's shape): ``--touched`` keys change one row each (a retraction and an addition)
    against ``K`` keys of 10 current rows; the round reads the touched keys' rows (rocksdb)."""
    spec = OverSpec("k", "t", (("avg_price", "avg", "price"),), rows=args.preceding, internal=("_kg",))
    keys = args.touched * scale
    per = 10
    held = rows(np.repeat(np.arange(keys), per), 10 * EPOCH + rng.integers(0, EPOCH, keys * per), rng, True)
    mine = held.filter(pc.is_in(held["k"], value_set=pa.array(np.arange(args.touched), pa.int64())))
    old = mine.take(pa.array(np.arange(0, mine.num_rows, per), pa.int64())).drop_columns([FIRED])
    new = rows(old["k"].to_numpy(), 11 * EPOCH + rng.integers(0, EPOCH, old.num_rows), rng, None)
    changes = pa.concat_tables([old, new]).append_column(
        "_sign", pa.array([-1] * old.num_rows + [1] * new.num_rows, pa.int32()))
    t0 = time.perf_counter()
    over_retract_step(spec, mine, changes, "_sign")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--touched", type=int, default=2_000)
    ap.add_argument("--preceding", type=int, default=10)
    ap.add_argument("--scales", default="1,10,30")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"load before: {os.getloadavg()}")
    rng = np.random.default_rng(1)
    for mode in ("keyed", "heap"):
        base = None
        for scale in (int(s) for s in args.scales.split(",")):
            best = min(one_round(args, scale, rng, mode == "keyed") for _ in range(args.repeat))
            base = base or best
            print(f"{mode:5s} state {scale:2d}x ({args.touched * scale * args.preceding:,} held rows): "
                  f"{best * 1000:7.1f} ms/round, {args.rows / best:,.0f} events/s, {best / base:.2f}x")
    base = None
    for scale in (int(s) for s in args.scales.split(",")):
        best = min(retract_round(args, scale, rng) for _ in range(args.repeat))
        base = base or best
        print(f"updating input, state {scale:2d}x ({args.touched * scale * 10:,} current rows): {best * 1000:7.1f} "
              f"ms/round, {2 * args.touched / best:,.0f} changelog rows/s, {best / base:.2f}x")
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
