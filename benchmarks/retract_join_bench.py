#!/usr/bin/env python3
"""Micro-benchmark of the retracting join kernel (a join reading an updating stream,
``pipeline.operators.retract_join.retract_join_step``, no Spark), as its state grows.

    .venv/bin/python benchmarks/retract_join_bench.py   # q5's shape: 20k rows a round, 1k-30k keys held, best of 5
    .venv/bin/python benchmarks/retract_join_bench.py --held touched   # the rows RocksDB reads: the touched keys'

One subtask's round of Nexmark q5's shape: ``--rows`` new left rows (per-window counts, an append stream) and, for
``--touched`` keys (windows), the right side's maximum retracted and re-added (a running aggregate's changelog),
against a held state of ``K`` keys (left: ``--per-key`` rows each; right: one row each) read whole (the heap
backend's case; RocksDB reads the touched keys only), for growing ``K``: the state-scale question (docs/operators.md
"Updating streams"). Prints rows/s, the round's time per state size, its ratio to the smallest state, and the load.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipeline.operators.retract import KG, SIGN  # noqa: E402
from pipeline.operators.retract_join import retract_join_step, state_schema  # noqa: E402

LEFT = pa.schema([("w", pa.int64()), ("auction", pa.int64()), ("num", pa.int64())])
RIGHT = pa.schema([("w", pa.int64()), ("maxn", pa.int64())])
OUTPUT = (("w", "l"), ("auction", "l"), ("num", "l"), ("maxn", "r"))


def left_rows(keys: np.ndarray, rng, start: int) -> pa.Table:
    n = len(keys)
    return pa.table({"w": pa.array(keys), "auction": pa.array(np.arange(start, start + n)),
                     "num": pa.array(rng.integers(1, 50, n)), KG: pa.array(keys % 64, pa.int32())})


def right_rows(keys: np.ndarray, maxn: np.ndarray, sign: int) -> pa.Table:
    return pa.table({"w": pa.array(keys), "maxn": pa.array(maxn),
                     SIGN: pa.array(np.full(len(keys), sign, dtype=np.int32)), KG: pa.array(keys % 64, pa.int32())})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/retract_join_bench.py", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--touched", type=int, default=1_000)
    ap.add_argument("--keys", default="1000,10000,30000", help="keys (windows) held in state")
    ap.add_argument("--per-key", type=int, default=5, help="left rows held per key")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--held", choices=("range", "touched"), default="range",
                    help="range: the whole state (heap); touched: the touched keys' rows only (RocksDB)")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(7)
    ls, rs = state_schema(LEFT), state_schema(RIGHT)
    base = None
    for k in [int(x) for x in a.keys.split(",")]:
        keys = np.arange(k, dtype=np.int64)
        first = retract_join_step("w", OUTPUT, LEFT, RIGHT, ls.empty_table(), rs.empty_table(),
                                  left_rows(np.repeat(keys, a.per_key), rng, 0),
                                  right_rows(keys, np.full(k, 10, dtype=np.int64), 1))
        touched = rng.choice(keys, min(a.touched, k), replace=False)
        new_left = left_rows(rng.choice(touched, a.rows), rng, k * a.per_key)
        rises = pa.concat_tables([right_rows(touched, np.full(len(touched), 10, dtype=np.int64), -1),
                                  right_rows(touched, np.full(len(touched), 20, dtype=np.int64), 1)])
        held_l, held_r = first.left, first.right
        if a.held == "touched":   # what the RocksDB backend hands the kernel
            tk = pa.array(touched)
            held_l = held_l.filter(pc.is_in(held_l["w"], value_set=tk))
            held_r = held_r.filter(pc.is_in(held_r["w"], value_set=tk))
        best = float("inf")
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            step = retract_join_step("w", OUTPUT, LEFT, RIGHT, held_l, held_r, new_left, rises)
            best = min(best, time.perf_counter() - t0)
        base = base or best
        rows = new_left.num_rows + rises.num_rows
        out = 0 if step.changelog is None else step.changelog.num_rows
        print(f"retract_join_step: {rows:,} rows touching {len(touched):,} keys, {k:,} keys held "
              f"({first.left.num_rows:,} + {first.right.num_rows:,} rows), {out:,} changelog rows out: best of "
              f"{a.repeat} {best * 1000:.0f} ms ({rows / best:,.0f} rows/s, {best / base:.2f}x the smallest state)")
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
