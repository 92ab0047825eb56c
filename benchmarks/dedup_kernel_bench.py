#!/usr/bin/env python3
"""Micro-benchmark of the deduplication kernel (``pipeline.operators.dedup.dedup_step``, no Spark).

    .venv/bin/python benchmarks/dedup_kernel_bench.py            # 200k new rows, 120k keys, 50k held, best of 7
    .venv/bin/python benchmarks/dedup_kernel_bench.py --rows 1000000 --keys 600000 --held 250000

One subtask's round: ``--rows`` new rows (own epochs, a 1 h TTL) over ``--keys`` keys against ``--held`` held
keys. Prints the best time, the output/dropped/state row counts and the load average.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipeline.operators.dedup import dedup_step  # noqa: E402
from pipeline.operators.ttl import ROW_EPOCH  # noqa: E402

TS = pa.timestamp("us", tz="UTC")
E = 60_000_000
TTL = 3600_000_000


def data(rows: int, keys: int, held: int, seed: int = 2) -> tuple[pa.Table, pa.Table]:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.integers(5 * E, 6 * E, rows))
    new = pa.table({"k": pa.array([f"c{i}" for i in rng.integers(0, keys, rows)]), "v": pa.array(np.arange(rows)),
                    "_ingest_ts": pa.array(t, TS), "_kg": pa.array(rng.integers(0, 64, rows), pa.int32()),
                    ROW_EPOCH: pa.array(t // E)})
    state = pa.table({"k": pa.array([f"c{i}" for i in rng.integers(0, keys, held)]),
                      "_ingest_ts": pa.array(rng.integers(4 * E, 5 * E, held), TS),
                      "_kg": pa.array(rng.integers(0, 64, held), pa.int32())})
    state = state.group_by("k").aggregate([("_ingest_ts", "max"), ("_kg", "min")]).rename_columns(
        ["k", "_ingest_ts", "_kg"])
    return state, new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/dedup_kernel_bench.py", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=120_000)
    ap.add_argument("--held", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args(argv)
    state, new = data(a.rows, a.keys, a.held)
    cut = pa.scalar(6 * E - TTL, TS)
    best = float("inf")
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        r = dedup_step(state, new, key="k", cutoff=cut, state_columns=["k", "_ingest_ts", "_kg"], ttl_us=TTL, epoch_us=E)
        best = min(best, time.perf_counter() - t0)
    print(f"dedup_step: {a.rows:,} rows, {a.keys:,} keys, {state.num_rows:,} held: best of {a.repeat} "
          f"{best:.3f} s; output {r.output.num_rows:,}, dropped {r.dropped:,}, state {r.state.num_rows:,}; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
