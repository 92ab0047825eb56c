"""Benchmark: catching up on a few new files per partition after a full run, vs a one-shot recompute of everything
(prints figures; not a test).

    .venv/bin/python benchmarks/catchup_bench.py                      # 2M demo orders, 24 epochs x 8 partitions
    .venv/bin/python benchmarks/catchup_bench.py --orders 200000      # smaller
    .venv/bin/python benchmarks/catchup_bench.py --variants "default;EPOCHAL_WORKER_PREIMPORT=0" --repeat 2

Target (issue 12, "Catch-up and S3"): catching up on 5 new files per partition after a full 2M-order run costs at
most 0.3x of a one-shot recompute of everything.

The history is the demo generator's (``pipeline.demo.generate``, one file per partition per epoch); the job is
``orders_payments`` (only its data and job are used; nothing is special-cased). Each phase runs in a fresh child
process (fresh JVM), one after the other:

1. **full**: ``epochal run`` over the first ``--epochs`` epochs, a checkpoint per epoch (its checkpoint and sink
   roots are then copied aside, so that every catch-up measurement starts from the same completed checkpoint);
2. the generator appends ``--new-epochs`` epochs (``--new-epochs`` new files per partition and source);
3. **catch-up** (once per ``--variants`` entry: extra environment of the child, e.g. a setting to compare): the
   full run's roots are put back, then ``epochal run`` restores the last checkpoint and completes one checkpoint
   per new epoch;
4. **one-shot**: the batch plan (:mod:`pipeline.batch.evaluation`) of the whole history (old + new epochs) evaluated at
   the last barrier, every sink table and operator state written as Parquet by Spark (a recompute of everything).

``job s`` excludes the Spark session start (``spark_start_s``, timed apart in every phase); ``wall s`` is the child
process; ``cpu s`` is the CPU time the child's whole process tree (driver, JVM, Python daemon and workers) spent
during ``job s`` (less sensitive to other processes on a shared machine than wall-clock time; ``vs one-shot`` is
given for both). The catch-up's committed sink row counts are compared with the one-shot's sink tables.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench_common import tree_cpu_s, write_oneshot

REPO = Path(__file__).resolve().parents[1]
CLOCK = "2026-06-01T00:00:00Z"
JOB = "orders_payments"


def _runner(root: Path, phase: str, parallelism: int, env: dict | None = None):
    from pipeline.config import load_config
    from pipeline.jobs import get_job
    from pipeline.runtime.driver.runner import JobRunner
    cfg = load_config(env=env or {}, source_uri=(root / "src").as_uri(),
                      checkpoint_uri=(root / phase / "ckpt").as_uri(), sink_uri=(root / phase / "sink").as_uri(),
                      clock_now=CLOCK, parallelism=parallelism)
    return JobRunner(get_job(JOB), cfg, echo=lambda m: None)


def _start(r) -> float:
    t = time.perf_counter()
    r.spark.range(1).count()
    return round(time.perf_counter() - t, 2)


def prepare(root: Path, epochs: int, partitions: int, orders: int) -> dict:
    from pipeline.demo.generate import generate
    t = time.perf_counter()
    s = generate((root / "src").as_uri(), epochs=epochs, partitions=partitions,
                 orders_per_epoch=max(1, orders // epochs))
    return {"generate_s": round(time.perf_counter() - t, 1), "rows": s.rows, "files": s.files}


def append(root: Path, epochs: int) -> dict:
    from pipeline.demo.generate import generate
    s = generate((root / "src").as_uri(), epochs=epochs, append=True)
    return {"rows": s.rows, "files": s.files, "epochs_total": s.epochs_total}


def measure(root: Path, phase: str, parallelism: int) -> dict:
    r = _runner(root, "full" if phase in ("full", "catchup") else phase, parallelism, dict(os.environ))
    out: dict = {"phase": phase, "spark_start_s": _start(r)}
    t, c = time.perf_counter(), tree_cpu_s()
    if phase == "oneshot":
        epoch, rows = write_oneshot(r, root / phase / "out")
        out.update(epoch=epoch, objects=rows)
        out["job_s"] = round(time.perf_counter() - t, 2)
        out["cpu_s"] = round(tree_cpu_s() - c, 1)
        return out
    rep = r.run()
    out["job_s"] = round(time.perf_counter() - t, 2)
    out["cpu_s"] = round(tree_cpu_s() - c, 1)
    done = rep.completed
    out.update(epoch=r.snapshot().metadata.epoch, checkpoints=len(done),
               epochs=[x.epoch for x in done], spark_rounds=len({x.tagged_round or (x.checkpoint_id, x.round) for x in rep.rounds}),
               rounds_s=round(sum(x.duration_s for x in rep.rounds), 2),
               round_s=[round(x.duration_s, 2) for x in rep.rounds],
               checkpoint_s=round(sum(x.checkpoint_s for x in rep.rounds), 2),
               committed={tb: r.table(tb).read().num_rows for tb in r.job.sink_tables()})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=None, help="working directory (default: bench-results/catchup-data-<orders>)")
    ap.add_argument("--orders", type=int, default=2_000_000)
    ap.add_argument("--epochs", type=int, default=24)
    ap.add_argument("--new-epochs", type=int, default=5, help="new files per partition (one per epoch)")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--variants", default="default",
                    help="';'-separated catch-up variants, each 'default' or KEY=VALUE[,KEY=VALUE] (child environment)")
    ap.add_argument("--repeat", type=int, default=1, help="catch-up measurements per value (the best is reported)")
    ap.add_argument("--no-oneshot", action="store_true")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse the data and the full run of an earlier invocation with the same --root/--orders")
    ap.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--append", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    root = Path(a.root or REPO / "bench-results" / f"catchup-data-{a.orders}").resolve()
    if a.prepare:
        print("RESULT " + json.dumps(prepare(root, a.epochs, a.partitions, a.orders)))
        return 0
    if a.append:
        print("RESULT " + json.dumps(append(root, a.new_epochs)))
        return 0
    if a.measure:
        print("RESULT " + json.dumps(measure(root, a.measure, a.parallelism), default=str))
        return 0
    reuse = a.reuse and (root / "full.after" / "result.json").exists()
    if not reuse:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
    env = {**os.environ, "GX_ANALYTICS_ENABLED": "False", "PYTHONPATH": str(REPO)}
    base = [sys.executable, str(Path(__file__).resolve()), "--root", str(root), "--orders", str(a.orders),
            "--epochs", str(a.epochs), "--partitions", str(a.partitions), "--parallelism", str(a.parallelism),
            "--new-epochs", str(a.new_epochs)]

    def child(*flag: str, extra: dict | None = None) -> dict:
        t = time.perf_counter()
        p = subprocess.run(base + list(flag), env={**env, **(extra or {})}, capture_output=True, text=True)
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        if p.returncode or line is None:
            sys.stderr.write(p.stdout[-3000:] + p.stderr[-6000:])
            raise SystemExit(f"child {flag} failed (exit {p.returncode})")
        d = json.loads(line[len("RESULT "):])
        d["wall_s"] = round(time.perf_counter() - t, 1)
        return d

    if reuse:
        prep, full, appended = json.loads((root / "full.after" / "result.json").read_text())
    else:
        prep = child("--prepare")
        full = child("--measure", "full")
        shutil.copytree(root / "full", root / "full.after")
        appended = child("--append")
        (root / "full.after" / "result.json").write_text(json.dumps([prep, full, appended]))
    catchups: dict[str, dict] = {}
    variants = [v.strip() for v in a.variants.split(";") if v.strip()]
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for _ in range(a.repeat):  # variants alternate, so that a noisy spell does not hit one variant only
        for v in variants:
            extra = {} if v == "default" else dict(kv.split("=", 1) for kv in v.split(","))
            shutil.rmtree(root / "full")
            shutil.copytree(root / "full.after", root / "full")
            runs[v].append(child("--measure", "catchup", extra=extra))
    for v, ds in runs.items():
        catchups[v] = {**min(ds, key=lambda d: d["job_s"]), "all_job_s": [d["job_s"] for d in ds],
                       "all_cpu_s": [d["cpu_s"] for d in ds]}
    one = None if a.no_oneshot else child("--measure", "oneshot")
    print(f"{a.orders:,} demo orders, {a.epochs} epochs x {a.partitions} partitions (+{a.new_epochs} new files per "
          f"partition), parallelism {a.parallelism}, load average {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    print(f"{'phase':<40}{'job s':>8}{'wall s':>8}{'cpu s':>8}{'vs one-shot':>13}{'cpu vs':>8}  details")
    rows = [("full run", full)] + [(f"catch-up ({k})", d) for k, d in catchups.items()]
    if one:
        rows.append(("one-shot recompute", one))
    for name, d in rows:
        ratio = f"{d['job_s'] / one['job_s']:.2f}x" if one else "-"
        cratio = f"{d['cpu_s'] / one['cpu_s']:.2f}x" if one and one.get("cpu_s") and d.get("cpu_s") else "-"
        det = {k: d[k] for k in ("epoch", "checkpoints", "spark_rounds", "rounds_s", "checkpoint_s", "spark_start_s")
               if k in d}
        print(f"{name:<40}{d['job_s']:>8.1f}{d['wall_s']:>8.1f}{d.get('cpu_s', float('nan')):>8.1f}{ratio:>13}{cratio:>8}  {det}")
    if one:
        for k, d in catchups.items():
            same = {tb: (n, one["objects"].get(f"sink/{tb}")) for tb, n in d["committed"].items()}
            print(f"catch-up {k}: job s of every run {d['all_job_s']}, cpu s {d['all_cpu_s']}; epoch {d['epoch']} vs one-shot epoch {one['epoch']}; committed rows "
                  f"(catch-up, one-shot) {same}; round s {d['round_s']}")
    out = REPO / "bench-results" / f"catchup-{a.orders}-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"prepare": prep, "full": full, "append": appended, "catchup": catchups,
                               "oneshot": one, "loadavg": os.getloadavg()}, indent=1, default=str))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
