"""The Spark Structured Streaming peer: the same Nexmark query as a user would run it on SSS instead.

The peer runs the query's own dataflow (the ``job()`` graph of ``benchmarks.nexmark.queries.qN``: the same
sources, the same Spark SQL filter/select expressions, the same inner equi-join) as one Structured Streaming
query: file sources over the generated Parquet files (``maxFilesPerTrigger``), a stream-stream inner join
without a watermark where the query joins (its state is never evicted, so it is exact), an exactly-once Parquet
file sink with a checkpoint location, ``Trigger.AvailableNow``. It runs in a fresh process (its own JVM).

Where the peer cannot express the query the same way it says so (``PEER_QUERIES`` lists the rest): event-time
windows (SSS windows have their own lateness and firing rules, so they would not produce the same rows) and
chains of stateful operators.

    python -m benchmarks.nexmark.peer --query q3 --src /tmp/nexmark/src --out /tmp/peer
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["PEER_QUERIES", "run_peer"]

PEER_QUERIES = ("q0", "q1", "q2", "q3", "q14", "q20", "q21", "q22")
REPO = Path(__file__).resolve().parents[2]


def run_peer(query: str, src: str, out: str | Path, max_files_per_trigger: int = 16,
             parallelism: int = 2) -> dict:
    """Run the peer in a fresh process; its RESULT dict (events_per_s, rows, seconds) or {"error": ...}."""
    cmd = [sys.executable, "-m", "benchmarks.nexmark.peer", "--query", query, "--src", str(src), "--out", str(out),
           "--max-files-per-trigger", str(max_files_per_trigger), "--parallelism", str(parallelism)]
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               PYSPARK_PYTHON=sys.executable)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(REPO), timeout=3600)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": (p.stderr.strip().splitlines() or ["(no output)"])[-1]}


def _dataflow(spark, job, src: str, ckpt: str, maxf: int):
    from pipeline.arrow_ddl import schema_ddl
    from pipeline.job import JoinNode, MapNode, SinkNode, SourceNode
    frames: dict[int, Any] = {}
    sink = None
    for i, n in enumerate(job.nodes):
        if isinstance(n, SourceNode):
            frames[i] = (spark.readStream.schema(schema_ddl(n.schema)).option("maxFilesPerTrigger", maxf)
                         .parquet(f"{src}/{n.name}/*/*.parquet"))
        elif isinstance(n, MapNode):
            df = frames[n.parent]
            frames[i] = df.filter(n.exprs[0]) if n.kind == "filter" else df.selectExpr(*n.exprs)
        elif isinstance(n, JoinNode):
            on = [n.on] if isinstance(n.on, str) else list(n.on)
            left, right = frames[n.left], frames[n.right]
            left = left.drop("_ingest_ts") if "_ingest_ts" in left.columns else left
            right = right.drop("_ingest_ts") if "_ingest_ts" in right.columns else right
            frames[i] = left.join(right, on=on, how="inner")
        elif isinstance(n, SinkNode):
            sink = frames[n.parent]
        else:
            raise ValueError(f"the peer cannot express {type(n).__name__}")
    return sink


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--query", required=True)
    ap.add_argument("--src", required=True, help="local directory of the generated sources")
    ap.add_argument("--out", required=True, help="local work directory (sink and checkpoint)")
    ap.add_argument("--max-files-per-trigger", type=int, default=16)
    ap.add_argument("--parallelism", type=int, default=2)
    a = ap.parse_args(argv)
    if a.query not in PEER_QUERIES:
        print("RESULT " + json.dumps({"error": "the peer cannot express this query"}))
        return 0
    from pyspark.sql import SparkSession
    t0 = time.time()
    spark = (SparkSession.builder.master("local[*]").appName(f"nexmark-peer-{a.query}")
             .config("spark.sql.shuffle.partitions", str(a.parallelism))
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.streaming.numRecentProgressUpdates", "1000").config("spark.ui.enabled", "false").getOrCreate())
    session_s = time.time() - t0
    job = importlib.import_module(f"benchmarks.nexmark.queries.{a.query}").job()
    out = Path(a.out)
    df = _dataflow(spark, job, a.src, str(out / "ckpt"), a.max_files_per_trigger)
    t1 = time.time()
    q = (df.writeStream.format("parquet").outputMode("append").option("checkpointLocation", str(out / "ckpt"))
         .option("path", str(out / "sink")).trigger(availableNow=True).start())
    q.awaitTermination()
    secs = time.time() - t1
    # events = the rows of the sources the query reads (what Epochal's run reports as records)
    import pyarrow.dataset as ds

    from pipeline.job import SourceNode
    rows_in = sum(ds.dataset(f"{a.src}/{n.name}", format="parquet").count_rows()
                  for n in job.nodes if isinstance(n, SourceNode))
    rows = spark.read.parquet(str(out / "sink")).count()
    print("RESULT " + json.dumps({"query": a.query, "events": rows_in, "seconds": round(secs, 2),
                                  "events_per_s": round(rows_in / secs) if secs else None, "rows": rows,
                                  "session_s": round(session_s, 1)}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
