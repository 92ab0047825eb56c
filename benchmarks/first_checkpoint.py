"""Time to the first checkpoint of a small job (issue 31, item 4): where the seconds between ``epochal run`` and its
first completed checkpoint go - the process and Spark start (until the restore is done: the "no checkpoint yet"
line) and the first round - and how the number of epochs the first round carries changes it.

A small job (clicks -> append sink + running aggregate per user; 2 partitions, ``--epochs`` epochs of ``--rows``
rows per partition, all in the past), run as a whole process (``python -m pipeline run``) per variant, the variants
interleaved ``--repeat`` times:

* ``k=8``: the default ``PIPELINE_MAX_EPOCHS_PER_ROUND=8`` (the first round carries up to 8 waiting epochs);
* ``k=1``: one epoch per round (the first round carries one epoch);
* ``follow``: ``run --follow --max-idle-seconds 0.1`` (its first round carries one epoch, the next ones up to 8).

Prints per run: seconds to the restore line (process + JVM + session), to the first ``checkpoint ... completed`` line,
to the last, and the exit; the machine's busy share (all cores, every process) while it ran, and the load average.

    .venv/bin/python benchmarks/first_checkpoint.py [--epochs 10] [--rows 200] [--repeat 2] [--variants k=8,k=1,follow]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_machine import HZ, NCPU, _machine_busy_jiffies, say  # noqa: E402
from pipeline.job import Job  # noqa: E402
from pipeline.testing.jobproc import JobProcess  # noqa: E402

TS = pa.timestamp("us", tz="UTC")
CLICKS = pa.schema([("cid", pa.string()), ("user", pa.string()), ("amount", pa.int64()), ("_ingest_ts", TS)])
T0 = datetime(2025, 6, 1, tzinfo=UTC)
E = 10


def clicks_job() -> Job:
    job = Job("first_ckpt_clicks", max_parallelism=16)
    clicks = job.source("clicks", CLICKS, key="user")
    clicks.sink("clicks_out")
    clicks.aggregate(uid="per_user", key="user", aggs={"n": ("count", None), "total": ("sum", "amount")}).sink(
        "user_totals", mode="upsert", key=["user"])
    return job


def write_source(root: Path, epochs: int, rows: int) -> None:
    for p in range(2):
        d = root / "clicks" / f"partition={p}"
        d.mkdir(parents=True, exist_ok=True)
        for k in range(epochs):
            pq.write_table(pa.table({
                "cid": [f"c{k}-{p}-{i}" for i in range(rows)], "user": [f"u{(i * 3 + k) % 50}" for i in range(rows)],
                "amount": [i % 20 for i in range(rows)],
                "_ingest_ts": [T0 + timedelta(seconds=k * E + i * (E - 1) / rows) for i in range(rows)]},
                schema=CLICKS), d / f"{k:08d}.parquet")


def one_run(variant: str, src: Path, work: Path) -> dict:
    env = {"PIPELINE_SOURCE_URI": src.as_uri(), "PIPELINE_CHECKPOINT_URI": (work / "ckpt").as_uri(),
           "PIPELINE_SINK_URI": (work / "sink").as_uri(), "PIPELINE_EPOCH_SECONDS": str(E),
           "PYTHONPATH": str(Path(__file__).resolve().parent)}
    args = ["run", "--job", "first_checkpoint:clicks_job"]
    if variant.startswith("k="):
        env["PIPELINE_MAX_EPOCHS_PER_ROUND"] = variant[2:]
    elif variant == "follow":
        args += ["--follow", "--max-idle-seconds", "0.1"]
    stamps: list[tuple[float, str]] = []
    b0, t0 = _machine_busy_jiffies(), time.monotonic()
    with JobProcess(args, env, echo=lambda ln: stamps.append((time.monotonic() - t0, ln))) as jp:
        rc = jp.wait(1800)
    wall = time.monotonic() - t0
    busy = (_machine_busy_jiffies() - b0) / (wall * HZ * NCPU)
    if rc != 0:
        raise SystemExit(f"{variant}: exit {rc}\n" + jp.log()[-3000:])
    ready = next(t for t, ln in stamps if "no checkpoint yet" in ln)
    done = [t for t, ln in stamps if re.match(r"checkpoint \d+ completed:", ln)]
    return {"variant": variant, "ready_s": ready, "first_s": done[0], "last_s": done[-1], "exit_s": wall,
            "checkpoints": len(done), "busy": busy, "load": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--rows", type=int, default=200, help="rows per epoch and partition")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--variants", default="k=8,k=1,follow")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="first_ckpt_"))
    try:
        write_source(tmp / "src", a.epochs, a.rows)
        say(f"{a.epochs} epochs x 2 partitions x {a.rows} rows; load average {os.getloadavg()}")
        runs = []
        for i in range(a.repeat):
            for v in a.variants.split(","):
                work = tmp / f"{v}-{i}"
                r = one_run(v, tmp / "src", work)
                shutil.rmtree(work, ignore_errors=True)
                runs.append(r)
                say(f"{v:7s} ready {r['ready_s']:5.1f} s  first checkpoint {r['first_s']:5.1f} s  last "
                    f"{r['last_s']:5.1f} s  exit {r['exit_s']:5.1f} s  ({r['checkpoints']} checkpoints; machine busy "
                    f"{r['busy']:.0%}, load {r['load']:.1f})")
        print("\nvariant  ready_s  first_ckpt_s  last_ckpt_s  exit_s   (medians)")
        for v in a.variants.split(","):
            rs = [r for r in runs if r["variant"] == v]
            med = {k: statistics.median(r[k] for r in rs) for k in ("ready_s", "first_s", "last_s", "exit_s")}
            print(f"{v:7s}  {med['ready_s']:7.1f}  {med['first_s']:12.1f}  {med['last_s']:11.1f}  {med['exit_s']:6.1f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
