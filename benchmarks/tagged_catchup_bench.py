"""Benchmark: catch-up of waiting epochs with one epoch per Spark round (``PIPELINE_MAX_EPOCHS_PER_ROUND=1``) vs
tagged rounds (``=8``), for an event-time window job and a job on the rocksdb keyed stores (prints figures; not a
test).

    .venv/bin/python benchmarks/tagged_catchup_bench.py                       # both jobs, 8 waiting epochs
    .venv/bin/python benchmarks/tagged_catchup_bench.py --jobs window --events 40000 --repeat 2

The jobs and the data are this benchmark's own (not the demo):

* ``window``: sliding event-time windows (60 s, sliding by 30 s) per user over ``events``, event times up to 60 s
  behind the ingest time (out of order, some late: dead letters), heap state, an append sink;
* ``rocksdb``: ``deduplicate`` on the event id (state grows with every event) -> running aggregate per user,
  ``PIPELINE_STATE_BACKEND=rocksdb``, an upsert sink.

Each phase runs in a fresh child process (fresh JVM), one after the other (one Spark process at a time):

1. **history**: ``run --epochs <history>`` (one checkpoint per epoch); its checkpoint and sink roots are copied
   aside, so every catch-up starts from the same completed checkpoint;
2. **catch-up** (per ``--ks`` value, alternating over ``--repeat``): the roots are put back and ``run`` completes
   the ``--new-epochs`` waiting epochs, one checkpoint each, with ``PIPELINE_MAX_EPOCHS_PER_ROUND=k``.

``job s`` excludes the Spark session start; ``cpu s`` is the CPU time of the child's whole process tree (driver,
JVM, Python workers) during ``job s``; the 1-minute load average is printed at the start and at the end of every
measurement (the machine is shared). The committed rows of every catch-up are compared (they must be equal).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench_common import tree_cpu_s

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 3, 2, tzinfo=UTC)
CLOCK = "2026-06-01T00:00:00Z"


def _job(name: str):
    import pyarrow as pa

    from pipeline.job import Job
    ts = pa.timestamp("us", tz="UTC")
    schema = pa.schema([("eid", pa.string()), ("user", pa.string()), ("amount", pa.int64()), ("_ingest_ts", ts)])
    if name == "window":
        job = Job("bench_tagged_window", max_parallelism=32)
        job.source("events", schema, key="eid").select(
            "user", "amount", "timestamp_micros(unix_micros(_ingest_ts) - pmod(hash(eid), 60000000)) AS et").window(
            uid="w", key="user", event_time="et", size_seconds=60, slide_seconds=30, max_out_of_orderness_seconds=20,
            allowed_lateness_seconds=10, aggs={"n": ("count", None), "total": ("sum", "amount")}).sink("user_windows")
        return job, {}
    job = Job("bench_tagged_rocksdb", max_parallelism=32)
    job.source("events", schema, key="eid").deduplicate(uid="seen", key="eid", ttl_seconds=3600).aggregate(
        uid="per-user", key="user", aggs={"n": ("count", None), "total": ("sum", "amount")}).sink(
        "totals", mode="upsert", key=["user"])
    return job, {"PIPELINE_STATE_BACKEND": "rocksdb"}


def prepare(root: Path, epochs: int, partitions: int, events: int, users: int) -> dict:
    """``epochs`` files per partition of ``events`` (per epoch), 60 s epochs from T0; 2 % repeat an earlier id."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = random.Random(7)
    ts = pa.timestamp("us", tz="UTC")
    n = events // partitions
    rows = 0
    for e in range(epochs):
        for p in range(partitions):
            ids = [f"e{e}-{p}-{i}" for i in range(n)]
            for i in range(0, n, 50):  # duplicates (the dedup drops them)
                ids[i] = f"e{max(0, e - 1)}-{p}-{i + 1}"
            d = root / "src" / "events" / f"partition={p}"
            d.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"eid": ids, "user": [f"u{rng.randrange(users)}" for _ in range(n)],
                                     "amount": [rng.randint(1, 100) for _ in range(n)],
                                     "_ingest_ts": [T0 + timedelta(seconds=60 * e + 59.9 * i / n) for i in range(n)]},
                                    schema=pa.schema([("eid", pa.string()), ("user", pa.string()),
                                                      ("amount", pa.int64()), ("_ingest_ts", ts)])),
                           d / f"{e:08d}.parquet")
            rows += n
    return {"rows": rows, "files": epochs * partitions}


def measure(root: Path, job_name: str, phase: str, epochs: int | None, parallelism: int) -> dict:
    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner
    job, extra = _job(job_name)
    cfg = load_config(env={**dict(os.environ), **extra}, source_uri=(root / "src").as_uri(),
                      checkpoint_uri=(root / "run" / "ckpt").as_uri(), sink_uri=(root / "run" / "sink").as_uri(),
                      clock_now=CLOCK, parallelism=parallelism, epoch_seconds=60, retained_checkpoints=30)
    r = JobRunner(job, cfg, echo=lambda m: None)
    t = time.perf_counter()
    r.spark.range(1).count()
    out: dict = {"phase": phase, "spark_start_s": round(time.perf_counter() - t, 2),
                 "max_epochs_per_round": cfg.max_epochs_per_round, "load_start": round(os.getloadavg()[0], 2)}
    t, c = time.perf_counter(), tree_cpu_s()
    rep = r.run(epochs)
    out["job_s"] = round(time.perf_counter() - t, 2)
    out["cpu_s"] = round(tree_cpu_s() - c, 1)
    out["load_end"] = round(os.getloadavg()[0], 2)
    done = rep.completed
    out.update(checkpoints=len(done), epochs=[x.epoch for x in done],
               spark_rounds=len({x.tagged_round or (x.checkpoint_id, x.round) for x in rep.rounds}),
               round_s=[round(x.duration_s, 2) for x in rep.rounds],
               committed={tb: r.table(tb).read().num_rows for tb in job.sink_tables()})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=None, help="working directory (default: bench-results/tagged-catchup-data)")
    ap.add_argument("--jobs", default="window,rocksdb")
    ap.add_argument("--events", type=int, default=20_000, help="events per epoch (all partitions)")
    ap.add_argument("--users", type=int, default=2_000)
    ap.add_argument("--history", type=int, default=4, help="epochs completed before the catch-up")
    ap.add_argument("--new-epochs", type=int, default=8, help="waiting epochs the catch-up completes")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--ks", default="1,8", help="values of PIPELINE_MAX_EPOCHS_PER_ROUND to compare")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--job", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--epochs", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    base_root = Path(a.root or REPO / "bench-results" / "tagged-catchup-data").resolve()
    if a.measure:
        print("RESULT " + json.dumps(measure(base_root, a.job, a.measure, a.epochs, a.parallelism), default=str))
        return 0
    env = {**os.environ, "GX_ANALYTICS_ENABLED": "False", "PYTHONPATH": str(REPO)}
    results: dict = {}
    for job_name in [j.strip() for j in a.jobs.split(",") if j.strip()]:
        root = base_root / job_name
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        prep = prepare(root, a.history + a.new_epochs, a.partitions, a.events, a.users)

        def child(phase: str, epochs: int | None, extra: dict, root: Path = root, job_name: str = job_name) -> dict:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--root", str(root),  # the job's own directory
                   "--measure", phase, "--job", job_name, "--parallelism", str(a.parallelism)]
            if epochs is not None:
                cmd += ["--epochs", str(epochs)]
            t = time.perf_counter()
            p = subprocess.run(cmd, env={**env, **extra}, capture_output=True, text=True)
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            if p.returncode or line is None:
                sys.stderr.write(p.stdout[-3000:] + p.stderr[-6000:])
                raise SystemExit(f"child {job_name}/{phase} failed (exit {p.returncode})")
            d = json.loads(line[len("RESULT "):])
            d["wall_s"] = round(time.perf_counter() - t, 1)
            return d

        history = child("history", a.history, {"PIPELINE_MAX_EPOCHS_PER_ROUND": "1"})
        shutil.copytree(root / "run", root / "run.after")
        runs: dict[str, list[dict]] = {k: [] for k in a.ks.split(",")}
        for _ in range(a.repeat):
            for k in runs:
                shutil.rmtree(root / "run")
                shutil.copytree(root / "run.after", root / "run")
                runs[k].append(child(f"catchup-k{k}", None, {"PIPELINE_MAX_EPOCHS_PER_ROUND": k}))
        results[job_name] = {"prepare": prep, "history": history, "catchup": runs}
        committed = {json.dumps(d["committed"], sort_keys=True) for ds in runs.values() for d in ds}
        print(f"\n{job_name}: {a.events:,} events per epoch x {a.partitions} partitions, history {a.history} epochs, "
              f"catch-up {a.new_epochs} epochs, parallelism {a.parallelism} ({os.cpu_count()} cores); "
              f"committed rows equal in every catch-up: {len(committed) == 1} {sorted(committed)}")
        print(f"{'phase':<22}{'job s':>8}{'cpu s':>8}{'wall s':>8}{'rounds':>8}{'ckpts':>7}  load (start, end)")
        for name, d in [("history (k=1)", history)] + [(f"catch-up k={k}", d) for k, ds in runs.items() for d in ds]:
            print(f"{name:<22}{d['job_s']:>8.1f}{d['cpu_s']:>8.1f}{d['wall_s']:>8.1f}{d['spark_rounds']:>8}"
                  f"{d['checkpoints']:>7}  ({d['load_start']}, {d['load_end']})")
    out = REPO / "bench-results" / f"tagged-catchup-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
