#!/usr/bin/env python3
"""Micro-benchmark of the top-N kernel (``pipeline.operators.rank.rank_step``, no Spark) as its state grows: the
state-scale question (docs/performance.md: a round should cost at most 1.2x at 30x the state).

    .venv/bin/python benchmarks/rank_bench.py      # 20k rows a round over 2,000 keys, n = 10, best of 5

One subtask's round on the heap backend: ``--rows`` new bids over ``--touched`` keys against a held state of ``K``
keys x ``n`` rows, for growing ``K`` (1x .. 30x); the round is the kernel over the touched keys plus what the task
does with the untouched ones (keep them: one hash-set filter over the state). The RocksDB backend reads the touched
keys' rows only, so its kernel time does not depend on ``K`` at all. Prints the round's time per state size, the
ratio to the smallest and the load average.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipeline.operators.rank import RANK, rank_step  # noqa: E402

TS = pa.timestamp("us", tz="UTC")


def bids(keys: np.ndarray, rng, t0: int) -> pa.Table:
    n = len(keys)
    return pa.table({"auction": pa.array(keys, pa.int64()), "bidder": pa.array(rng.integers(0, 10_000, n)),
                     "price": pa.array(rng.integers(1, 1_000_000, n)),
                     "channel": pa.array(rng.choice(["Google", "Apple", "Baidu"], n)),
                     "_ingest_ts": pa.array(t0 + np.arange(n), TS), "_kg": pa.array(keys % 128, pa.int32())})


def held_state(keys: int, n: int, rng) -> pa.Table:
    t = bids(np.repeat(np.arange(keys), n), rng, 0)
    rank = np.tile(np.arange(1, n + 1), keys)
    return t.append_column(RANK, pa.array(rank, pa.int32()))


def one_round(state: pa.Table, new: pa.Table, n: int) -> float:
    t0 = time.perf_counter()
    res = rank_step(state, new, key="auction", order_by=[("price", True)], n=n, skip=("_kg",))
    pa.concat_tables([res.untouched, res.state.select(state.schema.names).cast(state.schema)])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--touched", type=int, default=2_000)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    print(f"load before: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    base = None
    for scale in (1, 3, 10, 30):
        keys = args.touched * scale
        state = held_state(keys, args.n, rng)
        new = bids(rng.integers(0, args.touched, args.rows), rng, 10 ** 12)   # a round touches the same keys
        best = min(one_round(state, new, args.n) for _ in range(args.repeat))
        base = base or best
        print(f"state {keys:>7,} keys x {args.n} = {state.num_rows:>9,} rows: round {best * 1000:7.1f} ms "
              f"({args.rows / best:,.0f} rows/s), {best / base:.2f}x")
    print(f"load after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


if __name__ == "__main__":
    main()
