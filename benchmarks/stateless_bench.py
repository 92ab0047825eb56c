#!/usr/bin/env python3
"""The most common streaming job, measured: ``orders -> filter -> select -> Delta`` against a one-shot Spark batch
doing the same, on the demo's orders, both as whole processes (fresh JVM each, JVM start included).

    .venv/bin/python benchmarks/stateless_bench.py                    # 2M orders, 24 epochs, 8 partitions
    .venv/bin/python benchmarks/stateless_bench.py --orders 200000    # smaller

* ``epochal``: ``python -m pipeline run --job benchmarks.stateless_bench:job`` with a checkpoint every epoch
  (catch-up: several epochs per Spark round, as a job that starts behind would run), every sink commit a Delta
  commit through delta-rs.
* ``oneshot``: one Spark batch job in a fresh process: ``spark.read.parquet`` of every orders file, the same
  filter and select, Spark's Parquet writer, then one Delta commit of the written files through delta-rs (no
  delta-spark jar can be installed here), no checkpoints: the practical upper bound.

Both outputs are compared (row count and a sum of the selected amounts); the table prints wall time, events/s and
the ratio (Epochal / one-shot in events/s). The machine has 2 cores and is shared: the benchmark waits for a quiet
CPU before each run and prints the load average with each figure; read ratios, not absolute rates.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

import pyarrow.dataset as ds

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

FILTER = "amount > 20"
SELECT = ("order_id", "customer_id", "merchant_id", "amount * 100 AS cents", "event_time")


def job():
    """The benchmarked job (also loadable as ``benchmarks.stateless_bench:job``)."""
    from pipeline.demo.generate import ORDERS_SCHEMA
    from pipeline.job import Job
    j = Job("stateless_bench", max_parallelism=128)
    j.source("orders", ORDERS_SCHEMA).filter(FILTER).select(*SELECT).sink("big_orders", format="delta")
    return j


def _load() -> str:
    a, b, c = os.getloadavg()
    return f"load {a:.1f}/{b:.1f}/{c:.1f}"


def _wait_quiet(gate: float, max_wait: float) -> None:
    t0 = time.time()
    while os.getloadavg()[0] > gate and time.time() - t0 < max_wait:
        time.sleep(5)


def _oneshot_child(src: str, out: str, parallelism: int) -> None:
    """One Spark batch: read, filter, select, write Parquet; then one Delta commit of the files."""
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction
    from pyspark.sql import SparkSession
    t0 = time.time()
    spark = (SparkSession.builder.master(f"local[{parallelism}]").appName("oneshot-stateless")
             .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS").getOrCreate())
    files = sorted(glob.glob(os.path.join(src, "orders", "partition=*", "*.parquet")))
    df = spark.read.parquet(*files).filter(FILTER).selectExpr(*SELECT)
    data = os.path.join(out, "data")
    df.write.mode("overwrite").parquet(data)
    import pyarrow.parquet as pq
    written = sorted(glob.glob(os.path.join(data, "*.parquet")))
    schema = pq.read_schema(written[0]) if written else None
    if schema is not None:
        DeltaTable.create(out, schema, mode="ignore")
        now = int(time.time() * 1000)
        acts = [AddAction(os.path.relpath(f, out), os.path.getsize(f), {}, now, True,
                          json.dumps({"numRecords": pq.read_metadata(f).num_rows})) for f in written]
        DeltaTable(out).create_write_transaction(acts, "append", schema)
    spark.stop()
    print(json.dumps({"job_s": time.time() - t0}))


def _summary(table_dir: str) -> tuple[int, float]:
    from deltalake import DeltaTable
    t = DeltaTable(table_dir).to_pyarrow_table(columns=["cents"])
    import pyarrow.compute as pc
    return t.num_rows, round(float(pc.sum(t["cents"]).as_py() or 0.0), 2)


def _run(cmd: list[str], env: dict) -> tuple[float, str]:
    t0 = time.time()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return time.time() - t0, res.stdout


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orders", type=int, default=2_000_000)
    ap.add_argument("--epochs", type=int, default=24)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--epoch-seconds", type=int, default=60)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--workdir", default=os.path.join(REPO, ".epochal", "bench"))
    ap.add_argument("--quiet-gate", type=float, default=0.5, help="1-minute load average to wait for before a run")
    ap.add_argument("--quiet-max-wait", type=float, default=300)
    ap.add_argument("--repeat", type=int, default=1, help="measure each system this many times (best is reported)")
    a = ap.parse_args(argv)
    from bench_data import prepare_data
    root, _info = prepare_data(a)
    orders = ds.dataset(os.path.join(root, "orders"), format="parquet").count_rows()
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=os.pathsep.join([REPO, HERE]))
    results: dict[str, list[dict]] = {"oneshot": [], "epochal": []}
    for _ in range(a.repeat):
        out = os.path.join(a.workdir, "stateless-oneshot")
        shutil.rmtree(out, ignore_errors=True)
        _wait_quiet(a.quiet_gate, a.quiet_max_wait)
        load = _load()
        wall, _ = _run([sys.executable, __file__, "_oneshot", root, out, str(a.parallelism)], env)
        results["oneshot"].append({"wall_s": wall, "load": load, "out": _summary(out)})
        run = os.path.join(a.workdir, "stateless-epochal")
        shutil.rmtree(run, ignore_errors=True)
        e = dict(env, PIPELINE_SOURCE_URI="file://" + root, PIPELINE_CHECKPOINT_URI=f"file://{run}/ckpt",
                 PIPELINE_SINK_URI=f"file://{run}/sink", PIPELINE_EPOCH_SECONDS=str(a.epoch_seconds),
                 PIPELINE_PARALLELISM=str(a.parallelism))
        _wait_quiet(a.quiet_gate, a.quiet_max_wait)
        load = _load()
        wall, _ = _run([sys.executable, "-m", "pipeline", "run", "--job", "stateless_bench:job", "--json"], e)
        results["epochal"].append({"wall_s": wall, "load": load,
                                   "out": _summary(f"{run}/sink/stateless_bench/big_orders")})
    best = {k: min(v, key=lambda r: r["wall_s"]) for k, v in results.items()}
    same = best["oneshot"]["out"] == best["epochal"]["out"]
    print(f"\nstateless pipeline (orders -> filter -> select -> Delta), {orders:,} orders, {a.epochs} epochs, "
          f"{a.partitions} partitions, parallelism {a.parallelism}; whole processes, JVM start included")
    print(f"{'system':10} {'wall s':>8} {'events/s':>10} {'ratio':>6}  output (rows, sum cents)      load at start")
    base = orders / best["oneshot"]["wall_s"]
    for k in ("oneshot", "epochal"):
        r = best[k]
        rate = orders / r["wall_s"]
        print(f"{k:10} {r['wall_s']:8.1f} {rate:10,.0f} {rate / base:6.2f}  {str(r['out']):30} {r['load']}")
    print(f"outputs equal: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_oneshot":
        _oneshot_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
