#!/usr/bin/env python3
"""End-to-end benchmark of the interval join and the temporal join through the runtime (local Spark, file://): one
checkpoint per epoch while the operator's state grows, the per-checkpoint cost against the state size.

    .venv/bin/python benchmarks/timed_join_spark_bench.py --op interval --epochs 12 --events 10000
    .venv/bin/python benchmarks/timed_join_spark_bench.py --op temporal --backend rocksdb

Jobs of this benchmark's own making (two sources, 2 partitions each, ``--events`` rows per epoch and side):

* ``interval``: impressions x clicks on ``ad_id`` (``--keys`` ads) within ``[0, +1 day]``: every left row is held for
  a day of event time, so the left state grows by ``--events`` rows every epoch (30x after 30 epochs);
* ``temporal``: readings x device versions (``how="left"``), ``--events`` new devices every epoch (one version each),
  so the versions state grows by ``--events`` keys every epoch; readings of the known devices.

Printed per epoch (epoch 0 includes the JVM start): the epoch's wall time (one round = one checkpoint), events/s
(both sides), the state rows and the bytes the checkpoint persisted (``_metadata`` stats), the 1-min load.
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
LEFT = pa.schema([("lid", pa.string()), ("k", pa.string()), ("v", pa.int64()), ("lt", TS), ("_ingest_ts", TS)])
RIGHT = pa.schema([("rid", pa.string()), ("k", pa.string()), ("w", pa.int64()), ("rt", TS), ("_ingest_ts", TS)])


def build(op: str) -> Job:
    job = Job(f"{op}_bench", max_parallelism=64)
    left = job.source("left", LEFT, key="lid")
    right = job.source("right", RIGHT, key="rid")
    if op == "interval":
        out = left.interval_join(right, uid="ij", on="k", left_time="lt", right_time="rt", lower_seconds=0,
                                 upper_seconds=86_400, max_out_of_orderness_seconds=5)
    else:
        out = left.temporal_join(right, uid="tj", on="k", time="lt", version_time="rt", how="left",
                                 max_out_of_orderness_seconds=5)
    out.sink("out")
    return job


def generate(root: Path, op: str, epochs: int, events: int, keys: int) -> None:
    rng = np.random.default_rng(3)
    t0 = int(T0.timestamp()) * US
    for side, schema in (("left", LEFT), ("right", RIGHT)):
        for p in range(2):
            (root / side / f"partition={p}").mkdir(parents=True)
        for e in range(epochs):
            n = events
            t = np.sort(t0 + e * E * US + rng.integers(0, E * US, n))
            if op == "interval" or side == "left":
                top = keys if op == "interval" else max(events * (e + 1), 1)
                k = rng.integers(0, top, n)
            else:   # temporal: this epoch's new devices, one version each
                k = np.arange(e * events, (e + 1) * events)
            ids = [f"{side[0]}{e}-{i}" for i in range(n)]
            tab = pa.table({schema.names[0]: ids, "k": [f"k{x}" for x in k], schema.names[2]: rng.integers(0, 1000, n),
                            schema.names[3]: pa.array(t, TS), "_ingest_ts": pa.array(t, TS)}, schema=schema)
            for p in range(2):
                pq.write_table(tab.slice(p * n // 2, n // 2), root / side / f"partition={p}" / f"{e:08d}.parquet")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", choices=("interval", "temporal"), default="interval")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--backend", choices=("heap", "rocksdb"), default="rocksdb")
    ap.add_argument("--parallelism", type=int, default=2)
    args = ap.parse_args()
    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner
    root = Path(tempfile.mkdtemp(prefix=f"{args.op}-bench-"))
    generate(root / "src", args.op, args.epochs + 1, args.events, args.keys)
    cfg = load_config(env={}, source_uri=(root / "src").as_uri(), checkpoint_uri=(root / "ckpt").as_uri(),
                      sink_uri=(root / "sink").as_uri(), parallelism=args.parallelism, epoch_seconds=E,
                      retained_checkpoints=1000, state_backend=args.backend,
                      clock_now=(T0 + timedelta(seconds=E * (args.epochs + 2))).isoformat())
    r = JobRunner(build(args.op), cfg, echo=lambda m: None)
    print(f"{args.op} join, {args.backend}, P={args.parallelism}, {args.events:,} rows per side per epoch; "
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
            print(f"epoch {rr.epoch:>3}: {wall:6.2f} s ({2 * args.events / wall:>8,.0f} events/s) {ratio}  state "
                  f"{rows:>9,} rows, persisted {(st.checkpointed_bytes if st else 0) / 1e6:7.2f} MB, load "
                  f"{os.getloadavg()[0]:.2f}")
    print(f"load after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}; work dir {root}")


if __name__ == "__main__":
    main()
