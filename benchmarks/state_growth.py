#!/usr/bin/env python3
"""State-growth benchmark: full vs incremental state snapshots while the state grows at a constant delta.

    .venv/bin/python benchmarks/state_growth.py                         # 24 epochs x 10k events, ~5 min
    .venv/bin/python benchmarks/state_growth.py --epochs 30 --events 20000

The job (of this benchmark's own making): ``events(event_id, user, value)`` -> ``deduplicate(event_id)`` ->
``aggregate(count, sum per user)`` -> upsert sink. Every epoch brings ``--events`` new event ids, so the dedup
state grows by the same delta every epoch (after ``--epochs`` epochs it is ``--epochs`` times the first), while
the aggregate's state (``--users`` keys) only changes where users were touched.

Each mode runs in a fresh process (fresh JVM and Python workers; the executor environment differs):

* ``full``: ``PIPELINE_STATE_INCREMENTAL=false`` and the warm cache off (``PIPELINE_STATE_CACHE_MAX_BYTES=0``):
  every epoch reads its whole state from storage and writes it whole (the behaviour before docs/state.md);
* ``incremental``: changelog snapshots (defaults: at most 10 deltas, deltas <= 0.5 x base) and warm state.

Event ids are random 128-bit hex strings (like UUIDs), so the state's bytes grow with its rows. Printed per
epoch (epoch 0 includes the JVM start): the epoch's wall time (one round = one checkpoint), the state rows, the bytes the checkpoint
persisted and the full state size it represents (``_metadata`` stats). Results also go to ``--out`` (JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
EPOCH_S = 60


def _job():
    import pyarrow as pa

    from pipeline.job import Job
    schema = pa.schema([pa.field("event_id", pa.string()), pa.field("user", pa.string()),
                        pa.field("value", pa.int64()), pa.field("_ingest_ts", pa.timestamp("us", tz="UTC"))])
    job = Job("state_growth", max_parallelism=32)
    ev = job.source("events", schema, key="event_id")
    ev.deduplicate(uid="seen", key="event_id") \
        .aggregate(uid="per-user", key="user", aggs={"n": ("count", None), "total": ("sum", "value")}) \
        .sink("user_totals", mode="upsert", key=["user"])
    return job, schema


def generate(src: Path, epochs: int, events: int, users: int, partitions: int = 2) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    _, schema = _job()
    rng = np.random.default_rng(7)
    per = events // partitions
    for e in range(epochs):
        for p in range(partitions):
            d = src / "events" / f"partition={p}"
            d.mkdir(parents=True, exist_ok=True)
            ids = [f"{x:032x}" for x in rng.integers(0, 2**62, per)]  # UUID-like: state bytes grow too
            start = T0 + timedelta(seconds=e * EPOCH_S)
            ts = [start + timedelta(seconds=EPOCH_S * i / per) for i in range(per)]
            t = pa.table({"event_id": ids, "user": [f"u{u}" for u in rng.integers(0, users, per)],
                          "value": rng.integers(1, 100, per), "_ingest_ts": ts}, schema=schema)
            pq.write_table(t, d / f"{e:08d}.parquet")


def child(args) -> None:
    from pipeline.config import load_config
    from pipeline.runtime.runner import JobRunner
    job, _ = _job()
    root = Path(args.work)
    cfg = load_config(env={}, source_uri=(root / "src").as_uri(),
                      checkpoint_uri=(root / args.mode / "ckpt").as_uri(),
                      sink_uri=(root / args.mode / "sink").as_uri(), parallelism=2, epoch_seconds=EPOCH_S,
                      retained_checkpoints=1000, state_incremental=args.mode != "full",
                      clock_now=(T0 + timedelta(seconds=EPOCH_S * (args.epochs + 2))).isoformat())
    r = JobRunner(job, cfg, echo=lambda m: None)
    rep = r.run(args.epochs)
    by_id = {cp.checkpoint_id: cp.metadata for cp in r.coordinator.store.list()}
    rows = []
    for rr in rep.completed:
        md = by_id[rr.checkpoint_id]
        st = md.stats
        assert st is not None
        deltas = max((len(h.deltas) for h in md.state_handles()), default=0)
        rows.append({"epoch": rr.epoch, "checkpoint": rr.checkpoint_id, "epoch_s": round(rr.duration_s, 3),
                     "state_rows": st.rows, "bytes": st.bytes, "persisted_bytes": st.checkpointed_bytes,
                     "max_chain_deltas": deltas})
    Path(args.out).write_text(json.dumps(rows))


def med(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=24)
    ap.add_argument("--events", type=int, default=10_000, help="new events per epoch (all partitions)")
    ap.add_argument("--users", type=int, default=2_000)
    ap.add_argument("--modes", default="full,incremental")
    ap.add_argument("--out", default="", help="write all results as JSON here")
    ap.add_argument("--work", default="")
    ap.add_argument("_child", nargs="?")
    ap.add_argument("--mode", default="")
    args = ap.parse_args()
    if args._child == "_child":
        child(args)
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="state-growth-"))
    generate(work / "src", args.epochs, args.events, args.users)
    results = {}
    for mode in args.modes.split(","):
        env = {**os.environ, "PYTHONPATH": str(REPO), "PIPELINE_STATE_CACHE_DIR": str(work / mode / "cache")}
        if mode == "full":
            env["PIPELINE_STATE_CACHE_MAX_BYTES"] = "0"
        out = work / f"{mode}.json"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, __file__, "_child", "--mode", mode, "--epochs", str(args.epochs),
                        "--work", str(work), "--out", str(out)], env=env, check=True)
        results[mode] = {"wall_s": round(time.perf_counter() - t0, 1), "epochs": json.loads(out.read_text())}
    modes = list(results)
    print(f"{args.epochs} epochs x {args.events} new events, {args.users} users, parallelism 2, file://")
    print("epoch  state_rows | " + " | ".join(f"{m}: epoch_s  persisted/full bytes (deltas)" for m in modes))
    n = len(results[modes[0]]["epochs"])
    for i in range(n):
        cells = []
        for m in modes:
            e = results[m]["epochs"][i]
            cells.append(f"{m}: {e['epoch_s']:6.2f}  {e['persisted_bytes']:>10,}/{e['bytes']:>10,} ({e['max_chain_deltas']})")
        print(f"{i:5d}  {results[modes[0]]['epochs'][i]['state_rows']:>10,} | "
              + " | ".join(cells))
    for m in modes:
        es = results[m]["epochs"]
        k = max(1, len(es) // 4)
        first, last = es[1:1 + k], es[-k:]
        print(f"{m}: median epoch {med([e['epoch_s'] for e in first]):.2f} s (epochs 1-{k}) -> "
              f"{med([e['epoch_s'] for e in last]):.2f} s (last {k}); persisted in the last {k}: "
              f"{sum(e['persisted_bytes'] for e in last) / max(1, sum(e['bytes'] for e in last)):.1%} of full; "
              f"process wall {results[m]['wall_s']} s")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
