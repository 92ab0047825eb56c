"""Benchmark: a job started over a long history reaches the live epoch - bootstrap + restore vs epoch-by-epoch
catch-up vs one-shot batch (prints figures; not a test).

    .venv/bin/python benchmarks/bootstrap_bench.py                   # 2M demo orders, 24 epochs x 8 partitions
    .venv/bin/python benchmarks/bootstrap_bench.py --orders 200000   # smaller

The history is the demo generator's (``pipeline.demo.generate``); the job is ``orders_payments`` (join with
declared unique keys + an upsert aggregate; the demo only provides the data and its job here, nothing is special-
cased). Each phase runs in a fresh child process over the same sources, with its own checkpoint/sink roots:

* **one-shot**: the batch plan (:mod:`pipeline.batch.evaluation`) evaluated at the live barrier, every sink table and
  operator state written as Parquet by Spark (the lower bound: the same work without a savepoint);
* **bootstrap + restore**: ``epochal bootstrap`` (batch plan -> savepoint, sinks committed), then ``epochal
  restore --from`` it (a checkpoint of the job: state re-snapshotted by the tasks); the restore's post-restore
  quality suites are timed apart (``restore_validate_s``);
* **catch-up**: ``epochal run`` from scratch, a checkpoint per epoch, up to the same live epoch
  (``--max-epochs-per-round K``: ``PIPELINE_MAX_EPOCHS_PER_ROUND``, K epochs of backlog per round; default 8, the
  config's default; 1 for one epoch per round).

``job s`` excludes the Spark session start (timed apart as ``spark_start_s``); ``wall s`` is the child process;
``cpu s`` is the CPU time of the child's process tree (driver, JVM, Python workers) during ``job s``, and the
1-minute load average is printed at the start and end of every phase (the machine may be shared).
The one-shot and bootstrap children start their JVM with the batch process's JIT/GC options, as ``epochal
bootstrap`` / ``epochal batch`` do (:mod:`pipeline.batch.jvm`; ``EPOCHAL_BATCH_JVM_OPTS=`` empty: the JVM defaults;
printed as ``jvm_opts``); catch-up runs with the runtime's (the JVM defaults).
The one-shot reads the sources with the file splits ``epochal bootstrap`` / ``epochal batch`` use
(:func:`pipeline.batch.evaluation.prefix.scan_settings`). ``bootstrap_timings``: ``plan`` is everything before the objects are
written (checks, listing, summaries, the compiled plan, the dead-letter checks - which build the cached join frame
when a join declares ``unique``), then each object's own job, one after the other.
``--epochs 192`` gives a long history of many small files (1,536 per source).
``EPOCHAL_BATCH_NATIVE_READ=0`` in the environment makes the batch plan read every source through the runtime's
reader (the A/B of docs/batch.md).
Target (issue 10): bootstrap + restore within 1.2x of one-shot.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench_common import tree_cpu_s, write_oneshot

REPO = Path(__file__).resolve().parents[1]
CLOCK = "2026-06-01T00:00:00Z"
PHASES = ("oneshot", "bootstrap", "catchup")


def _runner(root: Path, phase: str, parallelism: int, epochs_per_round: int = 8):
    from pipeline.config import load_config
    from pipeline.jobs import get_job
    from pipeline.runtime.driver.runner import JobRunner
    cfg = load_config(env={}, source_uri=(root / "src").as_uri(), checkpoint_uri=(root / phase / "ckpt").as_uri(),
                      sink_uri=(root / phase / "sink").as_uri(), clock_now=CLOCK, parallelism=parallelism,
                      max_epochs_per_round=epochs_per_round)
    return JobRunner(get_job("orders_payments"), cfg, echo=lambda m: None)


def prepare(root: Path, epochs: int, partitions: int, orders: int) -> dict:
    from pipeline.demo.generate import generate
    if (root / "src" / "_generator.json").exists():
        return {"cached": True}
    t = time.perf_counter()
    s = generate((root / "src").as_uri(), epochs=epochs, partitions=partitions,
                 orders_per_epoch=max(1, orders // epochs))
    return {"generate_s": round(time.perf_counter() - t, 1), "rows": s.rows}


def measure(root: Path, phase: str, parallelism: int, epochs_per_round: int = 8) -> dict:
    import shutil
    shutil.rmtree(root / phase, ignore_errors=True)
    jvm_opts = None
    if phase in ("oneshot", "bootstrap"):   # what `epochal bootstrap` / `epochal batch` do in their own process
        from pipeline.batch.jvm import use_batch_jvm_options
        jvm_opts = use_batch_jvm_options()
    r = _runner(root, phase, parallelism, epochs_per_round)
    t = time.perf_counter()
    r.spark.range(1).count()   # session start, timed apart
    out: dict = {"phase": phase, "spark_start_s": round(time.perf_counter() - t, 2),
                 "load_start": round(os.getloadavg()[0], 2), "jvm_opts": jvm_opts or os.environ.get("SPARK_SUBMIT_OPTS")}
    if phase == "catchup":
        out["epochs_per_round"] = epochs_per_round
    t = time.perf_counter()
    c0 = tree_cpu_s()
    if phase == "oneshot":
        epoch, rows = write_oneshot(r, root / phase / "out")
        out.update(epoch=epoch, objects=rows)
    elif phase == "bootstrap":
        from pipeline.batch.bootstrap.savepoint import bootstrap
        d = bootstrap(r)
        out["bootstrap_s"] = round(time.perf_counter() - t, 2)
        out["bootstrap_timings"] = d.get("timings")
        t1 = time.perf_counter()
        rr = r.restore(d["savepoint"], validate=False)
        out["restore_s"] = round(time.perf_counter() - t1, 2)
        out.update(epoch=d["epoch"], objects=d["objects"], checkpoint=rr["checkpoint_id"])
        job_s = time.perf_counter() - t
        out["cpu_s"] = round(tree_cpu_s() - c0, 1)
        out["load_end"] = round(os.getloadavg()[0], 2)
        t2 = time.perf_counter()
        c2 = tree_cpu_s()
        from pipeline.quality import validate_restored
        v = validate_restored(r, rr)
        out["restore_validate_s"] = round(time.perf_counter() - t2, 2)
        out["restore_validate_cpu_s"] = round(tree_cpu_s() - c2, 1)
        out["restore_validate_success"] = bool(v.success)
        out["job_s"] = round(job_s, 2)
        out["committed"] = {tb: r.table(tb).read().num_rows for tb in r.job.sink_tables()}
        return out
    else:
        rep = r.run()
        out.update(epoch=r.snapshot().metadata.epoch, checkpoints=len(rep.completed),
                   committed={tb: r.table(tb).read().num_rows for tb in r.job.sink_tables()})
    out["job_s"] = round(time.perf_counter() - t, 2)
    out["cpu_s"] = round(tree_cpu_s() - c0, 1)
    out["load_end"] = round(os.getloadavg()[0], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=None, help="working directory (default: bench-results/bootstrap-data-<orders>)")
    ap.add_argument("--orders", type=int, default=2_000_000)
    ap.add_argument("--epochs", type=int, default=24)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--max-epochs-per-round", type=int, default=8,
                    help="catch-up: PIPELINE_MAX_EPOCHS_PER_ROUND (epochs of backlog per round; default: the "
                         "config's default, 8)")
    ap.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    root = Path(a.root or REPO / "bench-results" / f"bootstrap-data-{a.orders}").resolve()
    if a.prepare:
        print("RESULT " + json.dumps(prepare(root, a.epochs, a.partitions, a.orders)))
        return 0
    if a.measure:
        print("RESULT " + json.dumps(measure(root, a.measure, a.parallelism, a.max_epochs_per_round), default=str))
        return 0
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GX_ANALYTICS_ENABLED": "False", "PYTHONPATH": str(REPO)}
    base = [sys.executable, str(Path(__file__).resolve()), "--root", str(root), "--orders", str(a.orders),
            "--epochs", str(a.epochs), "--partitions", str(a.partitions), "--parallelism", str(a.parallelism),
            "--max-epochs-per-round", str(a.max_epochs_per_round)]

    def child(*flag: str) -> dict:
        t = time.perf_counter()
        p = subprocess.run(base + list(flag), env=env, capture_output=True, text=True)
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        if p.returncode or line is None:
            sys.stderr.write(p.stdout[-3000:] + p.stderr[-6000:])
            raise SystemExit(f"child {flag} failed (exit {p.returncode})")
        d = json.loads(line[len("RESULT "):])
        d["wall_s"] = round(time.perf_counter() - t, 1)
        return d

    prep = child("--prepare")
    results = {ph: child("--measure", ph) for ph in a.phases.split(",")}
    one = results.get("oneshot", {}).get("job_s")
    print(f"{a.orders:,} demo orders, {a.epochs} epochs x {a.partitions} partitions, parallelism {a.parallelism}, "
          f"load average {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    print(f"native source read: {os.environ.get('EPOCHAL_BATCH_NATIVE_READ', '1') != '0'}")
    print(f"{'phase':<22}{'job s':>9}{'cpu s':>9}{'wall s':>9}{'vs one-shot':>13}  details")
    for ph, d in results.items():
        ratio = f"{d['job_s'] / one:.2f}x" if one else "-"
        det = {k: v for k, v in d.items() if k in ("epoch", "bootstrap_s", "restore_s", "restore_validate_s",
                                                    "restore_validate_cpu_s", "checkpoints", "spark_start_s",
                                                    "bootstrap_timings", "epochs_per_round", "load_start",
                                                    "load_end")}
        print(f"{ph:<22}{d['job_s']:>9.1f}{d['cpu_s']:>9.1f}{d['wall_s']:>9.1f}{ratio:>13}  {det}")
    if "bootstrap" in results and "catchup" in results:
        b, c = results["bootstrap"], results["catchup"]
        same = b.get("committed") == c.get("committed")
        print(f"bootstrap+restore vs catch-up: {c['job_s'] / b['job_s']:.2f}x faster; same epoch "
              f"{b['epoch'] == c['epoch']}; same committed row counts {same} ({b.get('committed')})")
    out = REPO / "bench-results" / f"bootstrap-{a.orders}-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"prepare": prep, "results": results, "loadavg": os.getloadavg()}, indent=1,
                              default=str))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
