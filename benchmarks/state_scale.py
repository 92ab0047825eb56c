#!/usr/bin/env python3
"""State-scale rule (issues 31 item 5, 32 item 5): a steady epoch's cost must not grow with the state an operator
holds. For each stateful operator, a job of this benchmark's own making runs twice side by side in one process
(one Spark session): once holding ``--bulk`` rows of state (1x), once ``--scale`` times that (30x), the extra state
being rows of keys no later epoch touches (never-matched join rows within the TTL, never-repeated dedup ids,
aggregate groups and window keys no record updates again, interval-join rows within their bound, versions of
devices no reading asks for). Then both take the same steady epochs, interleaved 1x, 30x, 1x, ... (same load): a
few hundred records per epoch on a fixed set of keys, one epoch per round (``run(1)``).

    .venv/bin/python benchmarks/state_scale.py                                  # every operator, both backends
    .venv/bin/python benchmarks/state_scale.py --ops join,window --backends rocksdb --bulk 20000 --steady 8
    .venv/bin/python benchmarks/state_scale.py --s3                             # checkpoints and sinks on moto S3

Operators (``--ops``): ``join`` (inner, TTL one day), ``dedup`` (TTL one day), ``aggregate`` (count, sum),
``window`` (tumbling, one day: the bulk keys' windows never fire), ``interval`` (interval join, ``[0, +1 day]``),
``temporal`` (temporal join, ``how="left"``), ``session`` (session window, gap one day), ``over`` (over aggregate,
3 preceding rows), ``top_n`` (top 3 per key). Each epoch is 60 s of event time; the steady epochs carry
``--records`` rows on ``--keys`` fixed keys (split between the two inputs of a join; the dedup: half repeats).

Printed per operator and backend: the state rows at 1x and 30x (``_metadata`` stats), the median wall time of the
steady epochs at 1x and 30x, their ratio (the rule: <= 1.2), the ratio of the means and the max of each (an epoch
that materialises a base, every ``PIPELINE_STATE_MAX_DELTAS`` = 10 epochs, one of the 10 measured, is the max), and
the 1-min load average. ``--out`` keeps every epoch as
JSON. The default run (bulk 10,000 rows of ~150 bytes, 8 warm + 10 measured steady epochs, 9 operators, 2 backends)
takes about 25 minutes on the shared 2-core machine at load 15-20; ``--ops`` and ``--backends`` narrow it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_machine import say  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.job import Job  # noqa: E402
from pipeline.runtime.driver.runner import JobRunner  # noqa: E402
from pipeline.testing.moto_server import moto_s3_process  # noqa: E402

TS = pa.timestamp("us", tz="UTC")
E = 60
US = 1_000_000
DAY = 86_400
T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEFT = pa.schema([("lid", pa.string()), ("k", pa.string()), ("v", pa.int64()), ("lt", TS), ("lp", pa.string()),
                  ("_ingest_ts", TS)])
RIGHT = pa.schema([("rid", pa.string()), ("k", pa.string()), ("w", pa.int64()), ("rt", TS), ("rp", pa.string()),
                   ("_ingest_ts", TS)])
OPS = ("join", "dedup", "aggregate", "window", "interval", "temporal", "session", "over", "top_n")
TWO_INPUTS = ("join", "interval", "temporal")


def build(op: str) -> Job:
    """The job of operator ``op`` (sources ``left`` and, for the joins, ``right``)."""
    job = Job(f"scale_{op}", max_parallelism=64)
    left = job.source("left", LEFT, key="lid")
    if op == "join":
        right = job.source("right", RIGHT, key="rid")
        left.join(right, on="k", uid="j", ttl_seconds=DAY, output=["lid", "k", "v", "lp", "rid", "w", "rp"]).sink("out")
    elif op == "dedup":
        left.deduplicate(uid="d", key="lid", ttl_seconds=DAY).sink("out")
    elif op == "aggregate":
        left.aggregate(uid="a", key="k", aggs={"n": ("count", None), "total": ("sum", "v")}).sink(
            "out", mode="upsert", key=["k"])
    elif op == "window":
        left.window(uid="w", key="k", event_time="lt", size_seconds=DAY, max_out_of_orderness_seconds=5,
                    aggs={"n": ("count", None), "total": ("sum", "v")}).sink("out")
    elif op == "interval":
        right = job.source("right", RIGHT, key="rid")
        left.interval_join(right, uid="ij", on="k", left_time="lt", right_time="rt", lower_seconds=0,
                           upper_seconds=DAY, max_out_of_orderness_seconds=5).sink("out")
    elif op == "temporal":
        right = job.source("right", RIGHT, key="rid")
        left.temporal_join(right, uid="tj", on="k", time="lt", version_time="rt", how="left",
                           max_out_of_orderness_seconds=5).sink("out")
    elif op == "session":
        left.session_window(uid="s", key="k", event_time="lt", gap_seconds=DAY, max_out_of_orderness_seconds=5,
                            aggs={"n": ("count", None), "total": ("sum", "v")}).sink("out")
    elif op == "over":
        left.over_aggregate(uid="o", key="k", event_time="lt", rows_preceding=3, max_out_of_orderness_seconds=5,
                            aggs={"avg_v": ("avg", "v")}).sink("out")
    elif op == "top_n":
        left.top_n(uid="t", key="k", order_by="v DESC", n=3).sink("out", mode="upsert", key=["k", "rank_number"])
    else:
        raise SystemExit(f"unknown operator {op!r}; use one of {', '.join(OPS)}")
    return job


def _side(schema: pa.Schema, ids: list[str], keys: list[str], times: np.ndarray, rng, payload: int) -> pa.Table:
    """Rows of one input: ids, keys, a value, the event time (= ``_ingest_ts``) and ``payload`` random hex chars."""
    ts = pa.array(np.sort(times), TS)
    raw = rng.bytes(len(ids) * ((payload + 1) // 2)).hex()
    step = 2 * ((payload + 1) // 2)
    pads = [raw[i * step:i * step + payload] for i in range(len(ids))]
    return pa.table({schema.names[0]: ids, "k": keys, schema.names[2]: rng.integers(0, 1000, len(ids)),
                     schema.names[3]: ts, schema.names[4]: pads, "_ingest_ts": ts}, schema=schema)


def epoch_tables(op: str, epoch: int, bulk: int, records: int, keys: int, payload: int,
                 rng) -> dict[str, pa.Table]:
    """Epoch ``epoch``'s rows per source: epoch 0 the bulk (``bulk`` rows of keys never touched again), the others
    steady (``records`` rows on ``keys`` fixed keys, plus fresh ids where the operator keys by id)."""
    t = int(T0.timestamp()) * US + epoch * E * US

    def times(n: int) -> np.ndarray:
        return t + rng.integers(0, E * US, n)

    two = op in TWO_INPUTS
    out: dict[str, pa.Table] = {}
    if epoch == 0:
        n = bulk
        bulk_keys = [f"bulk{i}" for i in range(n)]
        if op == "temporal":   # the bulk is versions of devices no reading asks for
            out["left"] = LEFT.empty_table()
            out["right"] = _side(RIGHT, [f"rb{i}" for i in range(n)], bulk_keys, times(n), rng, payload)
        else:                  # left rows of keys no right row (or later record) ever has
            out["left"] = _side(LEFT, [f"lb{i}" for i in range(n)], bulk_keys, times(n), rng, payload)
            if two:
                out["right"] = RIGHT.empty_table()
        return out
    n = records // 2 if two else records
    fixed = [f"k{i % keys}" for i in range(n)]
    if op == "dedup":          # half repeats of fixed ids (dropped), half new ids
        ids = [f"fix{i % keys}" if i % 2 else f"l{epoch}-{i}" for i in range(n)]
    else:
        ids = [f"l{epoch}-{i}" for i in range(n)]
    out["left"] = _side(LEFT, ids, fixed, times(n), rng, payload)
    if two:
        if op == "temporal":   # one new version per fixed device and epoch at most
            m = min(n, keys)
            out["right"] = _side(RIGHT, [f"r{epoch}-{i}" for i in range(m)], [f"k{i}" for i in range(m)], times(m),
                                 rng, payload)
        else:
            out["right"] = _side(RIGHT, [f"r{epoch}-{i}" for i in range(n)], fixed, times(n), rng, payload)
    return out


def generate(src: Path, op: str, epochs: int, bulk: int, records: int, keys: int, payload: int) -> None:
    rng = np.random.default_rng(11)
    for e in range(epochs):
        for name, tab in epoch_tables(op, e, bulk, records, keys, payload, rng).items():
            for p in range(2):
                d = src / name / f"partition={p}"
                d.mkdir(parents=True, exist_ok=True)
                half = tab.num_rows // 2
                part = tab.slice(0, half) if p == 0 else tab.slice(half)
                pq.write_table(part, d / f"{e:08d}.parquet")


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _stats(r: JobRunner, checkpoint_id: int) -> dict:
    """The checkpoint's state rows and its slowest subtask's task time (``sync_ms`` + ``async_ms``: restore, kernel
    and snapshot, without Spark's scheduling and shuffle)."""
    md = next(cp.metadata for cp in r.coordinator.store.list() if cp.checkpoint_id == checkpoint_id)
    st = md.stats
    if st is None:
        return {"state_rows": 0, "task_ms": None}
    return {"state_rows": st.rows, "task_ms": round(st.sync_ms + st.async_ms, 1)}


def _epoch(r: JobRunner, verbose: bool = False, label: str = "") -> dict:
    t = time.perf_counter()
    rep = r.run(1)
    wall = time.perf_counter() - t
    done = list(rep.completed)
    if len(done) != 1:
        raise SystemExit(f"expected one completed checkpoint, got {rep.to_dict()}")
    row = {"epoch": done[0].epoch, "wall_s": round(wall, 3), **_stats(r, done[0].checkpoint_id), "load1": _load()}
    if verbose:
        say(f"  {label}: epoch {row['epoch']}: {wall:.2f} s, task {row['task_ms']} ms, {row['state_rows']:,} rows")
    return row


def measure(op: str, backend: str, work: Path, store_root: str, args) -> dict:
    """Both scales of ``op`` on ``backend``: bulk epoch, ``--warm`` steady epochs, then ``--steady`` measured
    steady epochs, the two runners interleaved."""
    runners = {}
    for scale in (1, args.scale):
        src = work / "src" / f"{op}-x{scale}"
        run_root = f"{store_root}/{op}-{backend}-x{scale}"
        cfg = load_config(env={}, source_uri=src.as_uri(), checkpoint_uri=f"{run_root}/ckpt",
                          sink_uri=f"{run_root}/sink", parallelism=2, epoch_seconds=E, retained_checkpoints=3,
                          state_backend=backend,
                          clock_now=(T0 + timedelta(seconds=E * (args.warm + args.steady + 3))).isoformat())
        runners[scale] = JobRunner(build(op), cfg, echo=lambda m: None)
    res: dict = {"op": op, "backend": backend, "bulk": {}, "warm": {}, "steady": {1: [], args.scale: []}}
    for scale, r in runners.items():
        res["bulk"][scale] = _epoch(r)
    for scale, r in runners.items():
        res["warm"][scale] = [_epoch(r) for _ in range(args.warm)]
    for _ in range(args.steady):
        for scale, r in runners.items():
            res["steady"][scale].append(_epoch(r, args.verbose, f"{op} {backend} x{scale}"))
    return res


def summary(res: dict, scale: int) -> dict:
    lo, hi = res["steady"][1], res["steady"][scale]
    m1, m30 = statistics.median(e["wall_s"] for e in lo), statistics.median(e["wall_s"] for e in hi)
    return {"rows_1x": lo[-1]["state_rows"], "rows_hi": hi[-1]["state_rows"], "median_1x": m1, "median_hi": m30,
            "ratio": m30 / m1, "task_ratio": _task_ratio(lo, hi), "mean_1x": statistics.fmean(e["wall_s"] for e in lo),
            "mean_hi": statistics.fmean(e["wall_s"] for e in hi), "max_1x": max(e["wall_s"] for e in lo), "max_hi": max(e["wall_s"] for e in hi),
            "load": [min(e["load1"] for e in lo + hi), max(e["load1"] for e in lo + hi)]}


def _task_ratio(lo: list[dict], hi: list[dict]) -> float | None:
    """The ratio of the medians of the slowest subtask's task time (None when not recorded)."""
    a, b = [e["task_ms"] for e in lo if e["task_ms"]], [e["task_ms"] for e in hi if e["task_ms"]]
    return statistics.median(b) / statistics.median(a) if a and b else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--backends", default="heap,rocksdb")
    ap.add_argument("--bulk", type=int, default=10_000, help="rows of never-touched state at 1x")
    ap.add_argument("--scale", type=int, default=30, help="the larger state is this many times the bulk")
    ap.add_argument("--records", type=int, default=400, help="records per steady epoch (all inputs)")
    ap.add_argument("--keys", type=int, default=100, help="fixed keys the steady epochs touch")
    ap.add_argument("--payload", type=int, default=100, help="random hex characters per row (the rows' width)")
    ap.add_argument("--warm", type=int, default=8, help="steady epochs before the measured ones (RocksDB compacts a "
                    "large write during the next few: the bulk epoch, and the over aggregate's bulk rows firing in "
                    "the first steady epoch)")
    ap.add_argument("--steady", type=int, default=10, help="measured steady epochs per scale (10 after "
                    "8 warm ones: the 11th delta of a chain is a new base, so one epoch of each materialises one)")
    ap.add_argument("--s3", action="store_true", help="checkpoints and sinks on a moto S3 server (loopback)")
    ap.add_argument("--verbose", action="store_true", help="print every steady epoch")
    ap.add_argument("--out", default="", help="every epoch as JSON here")
    args = ap.parse_args()
    ops = [o for o in args.ops.split(",") if o]
    work = Path(tempfile.mkdtemp(prefix="state-scale-"))
    epochs = 1 + args.warm + args.steady + 1
    for op in ops:
        for scale in (1, args.scale):
            generate(work / "src" / f"{op}-x{scale}", op, epochs, args.bulk * scale, args.records, args.keys,
                     args.payload)
    storage = "s3 (moto)" if args.s3 else "file://"
    say(f"state scale: {', '.join(ops)}; backends {args.backends}; bulk {args.bulk:,} x1 / x{args.scale}; "
        f"{args.records} records per steady epoch on {args.keys} keys; {args.warm} warm + {args.steady} measured "
        f"epochs; {storage}; work {work}; load {os.getloadavg()}")
    results = []
    moto = moto_s3_process(buckets=["state-scale"]) if args.s3 else None
    if moto is not None:
        moto.__enter__()
    try:
        root = "s3://state-scale/bench" if args.s3 else (work / "store").as_uri()
        for op in ops:
            for backend in args.backends.split(","):
                res = measure(op, backend, work, root, args)
                s = summary(res, args.scale)
                res["summary"] = s
                results.append(res)
                say(f"{op:9s} {backend:7s} {storage}: state {s['rows_1x']:>8,} -> {s['rows_hi']:>9,} rows; steady "
                    f"epoch median {s['median_1x']:.2f} s -> {s['median_hi']:.2f} s = {s['ratio']:.2f}x (mean "
                    f"{s['mean_hi'] / s['mean_1x']:.2f}x; task time {s['task_ratio'] or 0:.2f}x; max {s['max_1x']:.2f} / {s['max_hi']:.2f} s); bulk epoch {res['bulk'][1]['wall_s']:.1f} / "
                    f"{res['bulk'][args.scale]['wall_s']:.1f} s; load {s['load'][0]}-{s['load'][1]}")
    finally:
        if moto is not None:
            moto.__exit__(None, None, None)
    print(f"\n| operator | backend | storage | state rows 1x | state rows {args.scale}x | median 1x (s) | "
          f"median {args.scale}x (s) | ratio | mean ratio | max 1x / {args.scale}x (s) | load (1 min) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for res in results:
        s = res["summary"]
        print(f"| {res['op']} | {res['backend']} | {storage} | {s['rows_1x']:,} | {s['rows_hi']:,} | "
              f"{s['median_1x']:.2f} | {s['median_hi']:.2f} | **{s['ratio']:.2f}x** | {s['mean_hi'] / s['mean_1x']:.2f}x | {s['max_1x']:.2f} / "
              f"{s['max_hi']:.2f} | {s['load'][0]}-{s['load'][1]} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"storage": storage, "args": vars(args), "results": results}, indent=1,
                                             default=str))


if __name__ == "__main__":
    main()
