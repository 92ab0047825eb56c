"""Fixed cost of an epoch in a warm process (issue 31, item 2): what one small epoch costs once the Spark session,
the Python workers and the keyed state are warm, and where the time goes.

A small job (clicks -> append sink + running aggregate per user, upsert sink; ``first_checkpoint.clicks_job``) runs
in this process (``JobRunner``, as ``run --follow`` keeps it): ``--warm`` epochs first (the JVM, the workers, the
plan), then ``--epochs`` epochs one per round (``run(epochs=1)``, as when epochs arrive one at a time), each of
``--rows`` rows per partition (2 partitions). Per measured epoch the driver is profiled (cProfile) and its wall
time is split into:

* ``listing``: choosing the epoch (``next_work``: source listing, barriers logged write-ahead);
* ``spark``: the driver waiting on the JVM (its sockets: py4j calls, the round's Spark job(s) and their results);
* ``finalize``: acknowledgements, ``_metadata``, sink commits, retention (the round's ``checkpoint_s``);
* ``other``: the rest of the driver's Python (plan building, bookkeeping).

It prints each epoch's line, then the medians and the top driver functions by own time. ``--sink-format``
chooses the sinks' format (default: the job's, Epochal's own files); ``--s3`` runs on a moto S3 server on loopback
and adds the storage requests per epoch (moto's CPU per request is the machine's, so count, don't time, them).

    .venv/bin/python benchmarks/warm_epoch.py [--epochs 10] [--warm 2] [--rows 200] [--sink-format delta] [--s3]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from first_checkpoint import E, clicks_job, write_source  # noqa: E402

from benchmarks.bench_machine import say  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.fileio import file_io_for  # noqa: E402
from pipeline.fileio.request_counter import request_counts  # noqa: E402
from pipeline.runtime.driver.runner import JobRunner  # noqa: E402
from pipeline.testing.moto_server import moto_s3_process  # noqa: E402


def _split(stats: pstats.Stats) -> dict[str, float]:
    """Seconds the driver waited on the JVM (reads from its sockets: py4j answers and the results of Spark jobs)
    and in ``next_work`` (cumulative), from one epoch's profile."""
    out = {"spark": 0.0, "listing": 0.0}
    for (file, _line, fn), (_cc, _nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if file == "~" and "_socket.socket" in fn and "recv" in fn:
            out["spark"] += tt
        if fn == "next_work":
            out["listing"] = max(out["listing"], ct)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=10, help="measured epochs (one per round)")
    ap.add_argument("--warm", type=int, default=2, help="epochs before the measured ones (warm-up)")
    ap.add_argument("--rows", type=int, default=200, help="rows per epoch and partition")
    ap.add_argument("--sink-format", default="", help="PIPELINE_SINK_FORMAT (e.g. delta, iceberg)")
    ap.add_argument("--s3", action="store_true", help="on a moto S3 server on loopback")
    ap.add_argument("--top", type=int, default=12, help="driver functions to list by own time")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="warm_epoch_"))
    moto = None
    try:
        write_source(tmp / "src", a.warm + a.epochs, a.rows)
        root = (tmp / "store").as_uri()
        if a.s3:
            moto = moto_s3_process(buckets=["warm-epoch"])
            moto.__enter__()
            root = "s3://warm-epoch/bench"
            src = tmp / "src"
            fio = file_io_for(root)
            for f in sorted(src.rglob("*.parquet")):
                fio.write_bytes(f"{root}/src/{f.relative_to(src).as_posix()}", f.read_bytes())
            src_uri = f"{root}/src"
        else:
            src_uri = (tmp / "src").as_uri()
        env = {"PIPELINE_SOURCE_URI": src_uri, "PIPELINE_CHECKPOINT_URI": f"{root}/ckpt",
               "PIPELINE_SINK_URI": f"{root}/sink", "PIPELINE_EPOCH_SECONDS": str(E),
               "PIPELINE_PARALLELISM": "2", "PIPELINE_MAX_EPOCHS_PER_ROUND": "1"}
        if a.sink_format:
            env["PIPELINE_SINK_FORMAT"] = a.sink_format
        cfg = load_config(env={**os.environ, **env})
        say(f"warm epochs: {a.warm} + {a.epochs} measured x 2 partitions x {a.rows} rows, sinks "
            f"{a.sink_format or 'default'}, {'moto S3' if a.s3 else 'file://'}; load average {os.getloadavg()}")
        t0 = time.monotonic()
        runner = JobRunner(clicks_job(), cfg, echo=lambda m: None)
        runner.run(epochs=a.warm)
        say(f"warm-up: {time.monotonic() - t0:.1f} s (JVM, workers, {a.warm} epochs)")
        rows: list[dict] = []
        total: pstats.Stats | None = None
        for i in range(a.epochs):
            prof = cProfile.Profile()
            req0 = _requests()
            t = time.perf_counter()
            prof.enable()
            rep = runner.run(epochs=1)
            prof.disable()
            wall = time.perf_counter() - t
            done = [r for r in rep.rounds if r.completed]
            if len(done) != 1:
                raise SystemExit(f"epoch {i}: expected one completed checkpoint, got {rep.to_dict()}")
            st = pstats.Stats(prof)
            total = st if total is None else total.add(prof)
            split = _split(st)
            fin = done[0].checkpoint_s
            row = {"wall": wall, "listing": split["listing"], "spark": split["spark"], "finalize": fin,
                   "other": max(0.0, wall - split["listing"] - split["spark"] - fin),
                   "requests": _requests() - req0}
            rows.append(row)
            say(f"epoch {i + 1:2d}: {wall * 1000:6.0f} ms = listing {row['listing'] * 1000:5.0f} + spark "
                f"{row['spark'] * 1000:5.0f} + finalize {fin * 1000:5.0f} + other {row['other'] * 1000:5.0f} ms"
                + (f"; {row['requests']} driver storage requests" if a.s3 else "")
                + f" (load {os.getloadavg()[0]:.1f})")
        print("\nmedian per warm epoch (ms): " + ", ".join(
            f"{k} {statistics.median(r[k] for r in rows) * 1000:.0f}" for k in ("wall", "listing", "spark",
                                                                              "finalize", "other")))
        print(f"\ntop {a.top} driver functions by own time over the {a.epochs} measured epochs:")
        if total is not None:
            total.sort_stats("tottime").print_stats(a.top)
    finally:
        if moto is not None:
            moto.__exit__(None, None, None)
        shutil.rmtree(tmp, ignore_errors=True)


def _requests() -> int:
    """The driver's storage requests so far (this process's counter)."""
    return int(request_counts().total)


if __name__ == "__main__":
    main()
