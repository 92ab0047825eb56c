#!/usr/bin/env python3
"""End-to-end benchmark of the over aggregate through the runtime (local Spark, file://): one checkpoint per epoch
while the operator's state grows, the per-checkpoint cost against the state size.

    .venv/bin/python benchmarks/over_spark_bench.py --epochs 12 --events 10000 --backend rocksdb

A job of this benchmark's own making: one source (2 partitions, ``--events`` rows per epoch), the over aggregate
``AVG(price) OVER (PARTITION BY k ORDER BY t ROWS BETWEEN 10 PRECEDING AND CURRENT ROW)`` over ``--keys`` keys
(each key holds its last 10 rows, so the state grows by up to ``--events`` rows every epoch until the keys fill).

Printed per epoch (epoch 0 includes the JVM start): the epoch's wall time (one round = one checkpoint), events/s,
the state rows and the bytes the checkpoint persisted (``_metadata`` stats), the 1-min load.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipeline import Job  # noqa: E402

TS = pa.timestamp("us", tz="UTC")
E = 60
US = 1_000_000
T0 = datetime(2026, 1, 1, tzinfo=UTC)
ROWS = pa.schema([("id", pa.string()), ("k", pa.string()), ("price", pa.int64()), ("t", TS), ("_ingest_ts", TS)])


def build() -> Job:
    job = Job("over_bench", max_parallelism=64)
    (job.source("bids", ROWS, key="id")
     .over_aggregate(uid="ov", key="k", event_time="t", rows_preceding=10, max_out_of_orderness_seconds=5,
                     aggs={"avg_price": ("avg", "price")})
     .sink("out"))
    return job


def generate(root: Path, epochs: int, events: int, keys: int) -> None:
    rng = np.random.default_rng(3)
    t0 = int(T0.timestamp()) * US
    for p in range(2):
        (root / "bids" / f"partition={p}").mkdir(parents=True)
    for e in range(epochs):
        t = np.sort(t0 + e * E * US + rng.integers(0, E * US, events))
        k = rng.integers(0, keys, events)
        tab = pa.table({"id": [f"b{e}-{i}" for i in range(events)], "k": [f"k{x}" for x in k],
                        "price": rng.integers(0, 1000, events), "t": pa.array(t, TS), "_ingest_ts": pa.array(t, TS)},
                       schema=ROWS)
        for p in range(2):
            pq.write_table(tab.slice(p * events // 2, events // 2), root / "bids" / f"partition={p}" / f"{e:08d}.parquet")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--backend", choices=("heap", "rocksdb"), default="rocksdb")
    ap.add_argument("--parallelism", type=int, default=2)
    args = ap.parse_args()
    from pipeline.config import load_config  # lazy: the runtime (and Spark) only when the benchmark runs
    from pipeline.runtime.driver.runner import JobRunner  # lazy: as above
    root = Path(tempfile.mkdtemp(prefix="over-bench-"))
    generate(root / "src", args.epochs + 1, args.events, args.keys)
    cfg = load_config(env={}, source_uri=(root / "src").as_uri(), checkpoint_uri=(root / "ckpt").as_uri(),
                      sink_uri=(root / "sink").as_uri(), parallelism=args.parallelism, epoch_seconds=E,
                      retained_checkpoints=1000, state_backend=args.backend,
                      clock_now=(T0 + timedelta(seconds=E * (args.epochs + 2))).isoformat())
    r = JobRunner(build(), cfg, echo=lambda m: None)
    print(f"over aggregate (ROWS 10), {args.backend}, P={args.parallelism}, {args.events:,} rows per epoch; "
          f"load before: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    base = None
    for i in range(args.epochs):
        t1 = time.perf_counter()
        rep = r.run(1)
        wall = time.perf_counter() - t1
        for rr in rep.completed:
            md = next(cp.metadata for cp in r.coordinator.store.list() if cp.checkpoint_id == rr.checkpoint_id)
            st = md.stats
            rows = st.rows if st is not None else 0
            if i == 2:   # the ratio's base: the third epoch (the first pays the JVM, the second warms up)
                base = wall
            ratio = f"{wall / base:.2f}x" if base else "  -  "
            print(f"epoch {rr.epoch:>3}: {wall:6.2f} s ({args.events / wall:>8,.0f} events/s) {ratio}  state "
                  f"{rows:>9,} rows, persisted {(st.checkpointed_bytes if st else 0) / 1e6:7.2f} MB, load "
                  f"{os.getloadavg()[0]:.2f}")
    print(f"load after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}; work dir {root}")


if __name__ == "__main__":
    main()
