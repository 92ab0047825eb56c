#!/usr/bin/env python3
"""Reading a Delta table as a source (docs/how-to/lake-sources.md) against a Parquet file log of the same rows.

    .venv/bin/python benchmarks/lake_source_bench.py                      # reader only: 1M rows in 20 commits/files
    .venv/bin/python benchmarks/lake_source_bench.py --rows 200000 --spark  # and a whole job run per source

* ``reader``: what the driver and the executors do per row, in one process, without Spark: the listing (the Delta
  log's JSON per version, or the file log's LIST), the footer summaries, one plan of every row, and the
  :class:`~pipeline.source.reader.SplitReader` reading every split (the Delta reader adds ``_ingest_ts`` = commit
  time). events/s = rows / (list + summarise + plan + read).
* ``spark`` (``--spark``): ``JobRunner.run()`` of ``source -> select -> sink`` (Epochal's own sink format) in this
  process, a fresh checkpoint root per source, after one untimed warm-up run (Spark's first jobs: JIT, Python
  workers). All rows are in one epoch (one hour; commit times of the table, ``_ingest_ts`` of the log).

The Parquet log's files are written by pyarrow, the Delta table's by delta-rs (one ``write_deltalake`` append per
file, its default encoding): the same rows, not the same bytes. The machine is shared: the load average is printed
with every figure.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deltalake import write_deltalake  # noqa: E402

from pipeline.checkpoint.handles import Position  # noqa: E402
from pipeline.fileio import file_io_for  # noqa: E402
from pipeline.source.lake import list_lake_files  # noqa: E402
from pipeline.source.lake_commits import LakeTable  # noqa: E402
from pipeline.source.layout import list_source_files  # noqa: E402
from pipeline.source.planner import plan_segment  # noqa: E402
from pipeline.source.positions import end_position  # noqa: E402
from pipeline.source.reader import make_split_reader  # noqa: E402
from pipeline.source.summary import clear_summary_cache, summarize_source  # noqa: E402

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string()), ("amount", pa.int64()), ("_ingest_ts", TS)])
T0 = 1_767_225_600 * 1_000_000


def _load() -> str:
    a, b, c = os.getloadavg()
    return f"load {a:.1f}/{b:.1f}/{c:.1f}"


def _batch(i: int, n: int) -> pa.Table:
    ids = np.arange(i * n, (i + 1) * n, dtype=np.int64)
    return pa.table({"id": ids, "k": pa.array([f"k{x % 97}" for x in ids.tolist()]),
                     "amount": ids % 1000, "_ingest_ts": pa.array(T0 + ids, pa.int64()).cast(TS)}, schema=SCHEMA)


def write_data(root: Path, rows: int, files: int) -> tuple[str, str]:
    """A file log ``<root>/src/orders/partition=0/<i>.parquet`` and a Delta table ``<root>/delta`` (one commit per
    file), the same rows."""
    per = rows // files
    log = root / "src" / "orders" / "partition=0"
    log.mkdir(parents=True)
    for i in range(files):
        t = _batch(i, per)
        pq.write_table(t, log / f"{i:08d}.parquet")
        write_deltalake(str(root / "delta"), t.drop_columns(["_ingest_ts"]), mode="append")
    return (root / "src").as_uri(), (root / "delta").as_uri()


def _read_all(files_by_partition, dl: str) -> int:
    sums = summarize_source(files_by_partition)[0]
    seg = plan_segment(sums, Position(seq=0, row=0), end_position(sums), 10 ** 12)
    reader = make_split_reader(SCHEMA, ("id",), "fail", dl, "bench")
    return sum(b.num_rows for s in seg.splits for b in reader.read_split(s))


def bench_reader(src_root: str, delta_uri: str, dl: str, repeat: int) -> None:
    for label, lister in (
            ("parquet file log", lambda: list_source_files(file_io_for(src_root), src_root, "orders")),
            ("delta table", lambda: list_lake_files("orders", LakeTable("delta", delta_uri), SCHEMA, 0))):
        best = None
        n = 0
        for _ in range(repeat):
            clear_summary_cache()
            t0 = time.perf_counter()
            n = _read_all(lister(), dl)
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        assert best is not None
        print(f"reader  {label:17s} {n:>9,d} rows  {best:6.2f} s  {n / best:>12,.0f} events/s  ({_load()})",
              flush=True)


def bench_spark(root: Path, src_root: str, delta_uri: str, rows: int) -> None:
    from pipeline.config import load_config
    from pipeline.job import Job
    from pipeline.runtime.driver.runner import JobRunner

    def run(label: str, table: str | None, *, show: bool = True) -> None:
        job = Job(f"lake_bench_{label.split()[0]}")
        (job.source("orders", SCHEMA, key="id", table=table) if table else
         job.source("orders", SCHEMA, key="id")).select("id", "k", "amount").sink("out")
        cfg = load_config(env={}, source_uri=src_root, checkpoint_uri=(root / label.split()[0] / "ckpt").as_uri(),
                          sink_uri=(root / label.split()[0] / "sink").as_uri(), epoch_seconds=3600,
                          clock_now="2031-01-01T00:00:00Z", parallelism=2)
        r = JobRunner(job, cfg, echo=lambda m: None)
        r.ctx.start_spark()
        t0 = time.perf_counter()
        r.run()
        dt = time.perf_counter() - t0
        out = root / label.split()[0] / "export"
        r.export("out", str(out))
        n = pq.read_table(out).num_rows   # every row once
        if show:
            print(f"spark   {label:17s} {dt:6.2f} s for run()  {rows / dt:>10,.0f} events/s  "
                  f"({len(r.coordinator.store.list())} checkpoint(s), {n:,d} records)  ({_load()})", flush=True)

    run("warmup", "delta:" + delta_uri, show=False)   # Spark's first jobs (JIT, Python workers) timed in neither
    run("parquet file log", None)
    run("delta table", "delta:" + delta_uri)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--spark", action="store_true", help="also one job run per source through Spark")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lake-bench-"))
    try:
        src_root, delta_uri = write_data(root, args.rows, args.files)
        print(f"{args.rows:,d} rows in {args.files} files / commits; {os.cpu_count()} cores; {_load()}", flush=True)
        bench_reader(src_root, delta_uri, (root / "dl").as_uri(), args.repeat)
        if args.spark:
            bench_spark(root, src_root, delta_uri, args.rows // args.files * args.files)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
