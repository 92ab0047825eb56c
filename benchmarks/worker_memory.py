#!/usr/bin/env python3
"""Where an idle Python worker's memory goes: the modules the executors' daemon imports, and a real worker's RSS.

    .venv/bin/python benchmarks/worker_memory.py imports        # RSS after each preimported module (one interpreter)
    .venv/bin/python benchmarks/worker_memory.py spark          # a local session: the daemon's and idle workers' RSS
    .venv/bin/python benchmarks/worker_memory.py spark --no-preimport   # the same with PySpark's plain daemon
    .venv/bin/python benchmarks/worker_memory.py imports spark --out /tmp/worker_memory.json

``imports``: a fresh interpreter imports :data:`pipeline.runtime.spark.worker_daemon.PREIMPORTED` one module after the
other, as the daemon does, and prints after each the resident set (VmRSS), what it added, and which heavy
third-party packages it loaded (pandas, numpy, boto3, pyiceberg, deltalake, duckdb, Great Expectations, ...).

``spark``: a local session (``local[2]``, the project's session settings) runs two trivial ``mapInArrow`` tasks;
each task reports its worker's VmRSS, how it splits (anonymous / file-backed; private / shared with the daemon it
was forked from, PSS: ``/proc/<pid>/smaps_rollup``), the daemon's RSS, and which heavy packages the worker holds.
Figures, not a test; one Spark process at a time.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("pandas", "numpy", "boto3", "botocore", "pyiceberg", "deltalake", "duckdb", "great_expectations",
         "sqlalchemy", "rocksdict", "pyspark.pandas", "scipy", "pydantic", "airflow", "moto", "jinja2",
         "pyarrow.dataset", "pyarrow.fs", "pyarrow.parquet", "pyarrow.compute")

_IMPORTS = r"""
import importlib, json, sys
HEAVY = %(heavy)r
def rss():
    for ln in open("/proc/self/status"):
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1]) * 1024
from pipeline.runtime.spark.worker_daemon import PREIMPORTED
rows, before = [], rss()
rows.append({"module": "(interpreter + pipeline.runtime.spark.worker_daemon)", "rss": before, "added": before, "heavy": []})
for name in PREIMPORTED:
    held = {h for h in HEAVY if h in sys.modules}
    try:
        importlib.import_module(name)
        err = None
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
    now = rss()
    rows.append({"module": name, "rss": now, "added": now - before, "error": err,
                 "heavy": sorted(h for h in HEAVY if h in sys.modules and h not in held)})
    before = now
print("RESULT " + json.dumps(rows))
"""


def imports() -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", _IMPORTS % {"heavy": HEAVY}], env=env, capture_output=True,
                       text=True, timeout=300)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(p.stdout[-2000:] + p.stderr[-4000:])
    rows = json.loads(line[len("RESULT "):])
    print(f"{'module':<40} {'RSS MiB':>8} {'added':>7}  heavy packages it loaded")
    for r in rows:
        print(f"{r['module']:<40} {r['rss'] / 2**20:8.0f} {r['added'] / 2**20:7.0f}  {', '.join(r['heavy'])}"
              f"{'  FAILED ' + r['error'] if r.get('error') else ''}")
    return rows


_SPARK = r"""
import json, os, sys
from pipeline.runtime.spark.session import get_spark, stop_spark
HEAVY = %(heavy)r

def _fields(path, keys):
    out = {}
    try:
        for ln in Path(path).read_text().splitlines():
            k, _, v = ln.partition(":")
            if k in keys:
                out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out

def probe(batches):
    import pyarrow as pa
    for b in batches:
        pass
    me = _fields("/proc/self/status", ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"))
    me.update(_fields("/proc/self/smaps_rollup", ("Pss", "Private_Clean", "Private_Dirty", "Shared_Clean",
                                                  "Shared_Dirty")))
    daemon = _fields(f"/proc/{os.getppid()}/status", ("VmRSS",))
    pool = pa.default_memory_pool()
    yield pa.RecordBatch.from_pylist([{"pid": os.getpid(), "stats": json.dumps(me),
                                       "daemon_rss": daemon.get("VmRSS", 0),
                                       "pool": f"{pool.backend_name} {pa.total_allocated_bytes()}",
                                       "heavy": ",".join(h for h in HEAVY if h in sys.modules)}])

spark = get_spark("local[2]", 2, app="worker-memory")
rows = []
for _ in range(2):
    rows += [r.asDict() for r in spark.range(0, 2, 1, 2).mapInArrow(
        probe, "pid long, stats string, daemon_rss long, pool string, heavy string").collect()]
stop_spark()
print("RESULT " + json.dumps(rows))
"""


def spark(preimport: bool = True) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable,
           "EPOCHAL_WORKER_PREIMPORT": "1" if preimport else "0"}
    p = subprocess.run([sys.executable, "-c", _SPARK % {"heavy": HEAVY}], env=env, capture_output=True, text=True,
                       timeout=600)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(p.stdout[-2000:] + p.stderr[-4000:])
    rows = json.loads(line[len("RESULT "):])
    for r in rows:
        s = json.loads(r["stats"])
        mib = {k: v / 2**20 for k, v in s.items()}
        print(f"worker {r['pid']}: RSS {mib.get('VmRSS', 0):.0f} MiB (anon {mib.get('RssAnon', 0):.0f}, file "
              f"{mib.get('RssFile', 0):.0f}; private {mib.get('Private_Clean', 0) + mib.get('Private_Dirty', 0):.0f}, "
              f"shared {mib.get('Shared_Clean', 0) + mib.get('Shared_Dirty', 0):.0f}, PSS {mib.get('Pss', 0):.0f}); "
              f"daemon RSS {r['daemon_rss'] / 2**20:.0f} MiB; Arrow pool {r['pool']}; heavy: {r['heavy']}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="+", choices=("imports", "spark"))
    ap.add_argument("--out", default="")
    ap.add_argument("--no-preimport", action="store_true", help="spark: PySpark's plain daemon (EPOCHAL_WORKER_PREIMPORT=0)")
    args = ap.parse_args()
    out = {"load": os.getloadavg()[0]}
    for part in args.parts:
        out[part] = imports() if part == "imports" else spark(not args.no_preimport)
    print(f"(load average {os.getloadavg()[0]:.1f})")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
