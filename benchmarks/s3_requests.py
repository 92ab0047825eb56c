#!/usr/bin/env python3
"""S3 requests per epoch against the epoch number: do they grow with history?

    .venv/bin/python benchmarks/s3_requests.py                      # 60 epochs, ~5 min
    .venv/bin/python benchmarks/s3_requests.py --epochs 20 --out /tmp/s3req.json
    .venv/bin/python benchmarks/s3_requests.py --page-size 10      # LIST pages of 10 keys: 100x the history
    .venv/bin/python benchmarks/s3_requests.py --plot docs/img/s3_requests.png /tmp/s3req.json

A job of this benchmark's own making, everything on moto S3 (a server in a child process on loopback):
``clicks(click_id, user, value)`` (2 partitions) -> ``deduplicate(click_id)`` -> ``aggregate(count, sum per
user)`` -> upsert sink. Files arrive as time goes on: before epoch e, one new file per partition with that
epoch's rows is written straight to moto (not counted), then a fresh :class:`~pipeline.runtime.driver.runner.JobRunner`
(like one Airflow task: restore, then ``run(1)``; the Spark session is shared) completes epoch e. Retention keeps
the default 3 checkpoints.

Every S3 client goes through a counting proxy (:class:`pipeline.testing.s3_faults.S3FaultProxy` with no faults),
so ``total`` is every request any process sent (driver and Spark's Python workers); ``driver`` is the driver's
own counter (:mod:`pipeline.fileio.request_counter`) over the whole ``run(1)``; ``executors`` = total - driver.
``stats`` is what the checkpoint's ``_metadata`` recorded (``stats.s3_requests``: the driver up to ``_metadata``).
Printed: one line per epoch with LIST/GET/HEAD/PUT/DELETE of the total, then driver and executor totals; at the
end the mean of the first and the last 10 epochs and the slope of LIST per epoch (requests per 100 epochs).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

T0 = datetime(2024, 1, 1, tzinfo=UTC)
EPOCH_S = 60
BUCKET = "s3-requests"
KINDS = ("list", "get", "head", "put", "delete")


def make_job():
    import pyarrow as pa

    from pipeline.job import Job
    schema = pa.schema([pa.field("click_id", pa.string()), pa.field("user", pa.string()),
                        pa.field("value", pa.int64()), pa.field("_ingest_ts", pa.timestamp("us", tz="UTC"))])
    job = Job("s3_requests", max_parallelism=16)
    clicks = job.source("clicks", schema, key="click_id")
    clicks.deduplicate(uid="seen", key="click_id") \
        .aggregate(uid="per-user", key="user", aggs={"n": ("count", None), "total": ("sum", "value")}) \
        .sink("user_totals", mode="upsert", key=["user"])
    return job, schema


def write_epoch_files(client, prefix: str, epoch: int, rows: int, partitions: int, schema) -> None:
    """One file per partition holding epoch ``epoch``'s rows, written straight to the server (not counted)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    per = rows // partitions
    for p in range(partitions):
        start = T0 + timedelta(seconds=epoch * EPOCH_S)
        t = pa.table({"click_id": [f"e{epoch}-p{p}-{i}" for i in range(per)],
                      "user": [f"u{(epoch * 7 + i) % 50}" for i in range(per)],
                      "value": [i % 10 for i in range(per)],
                      "_ingest_ts": [start + timedelta(seconds=EPOCH_S * i / per) for i in range(per)]}, schema=schema)
        buf = io.BytesIO()
        pq.write_table(t, buf)
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/clicks/partition={p}/{epoch:08d}.parquet", Body=buf.getvalue())


def _small_pages(page_size: int) -> None:
    """Every LIST page of the driver's S3 clients holds at most ``page_size`` keys (also for code before
    ``PIPELINE_S3_LIST_PAGE_SIZE`` existed): a scale model of S3's 1000-key pages for a longer history."""
    import pipeline.fileio.s3 as s3mod
    os.environ["PIPELINE_S3_LIST_PAGE_SIZE"] = str(page_size)
    make = s3mod._boto_client

    def set_max_keys(params, **kwargs) -> None:
        params.setdefault("MaxKeys", page_size)

    def client(settings):
        c = make(settings)
        if not getattr(c, "_bench_small_pages", False):
            c.meta.events.register("before-parameter-build.s3.ListObjectsV2", set_max_keys)
            c._bench_small_pages = True
        return c
    s3mod._boto_client = client


def _driver_counts():
    """The driver's request counter, or None where it does not exist (code before it)."""
    try:
        from pipeline.fileio.request_counter import request_counts
    except ImportError:
        return None
    return request_counts()


def run(epochs: int, rows: int, partitions: int, parallelism: int, echo=print, page_size: int = 0) -> list[dict]:
    """Run the job epoch by epoch on moto S3 behind a counting proxy; one dict of request counts per epoch."""
    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner
    from pipeline.testing.moto_server import _admin_client, spawn_moto_server
    from pipeline.testing.s3_faults import S3FaultProxy

    job, schema = make_job()
    if page_size:
        _small_pages(page_size)
    moto = spawn_moto_server([BUCKET])
    proxy = S3FaultProxy(moto.env()["AWS_ENDPOINT_URL"]).start()
    saved = {k: os.environ.get(k) for k in moto.env()}
    os.environ.update({**moto.env(), "AWS_ENDPOINT_URL": proxy.endpoint_url})
    os.environ.pop("AWS_ENDPOINT_URL_S3", None)
    direct = _admin_client(moto.env()["AWS_ENDPOINT_URL"], moto.env()["AWS_DEFAULT_REGION"])
    prefix = f"run-{int(time.time())}"
    root = f"s3://{BUCKET}/{prefix}"
    out: list[dict] = []
    try:
        for e in range(epochs):
            write_epoch_files(direct, f"{prefix}/src", e, rows, partitions, schema)
            cfg = load_config(env={}, source_uri=f"{root}/src", checkpoint_uri=f"{root}/ckpt",
                              sink_uri=f"{root}/sink", parallelism=parallelism, epoch_seconds=EPOCH_S,
                              clock_now=(T0 + timedelta(seconds=EPOCH_S * (e + 1) + 1)).isoformat())
            before_total, before_driver = dict(proxy.by_kind), _driver_counts()
            t0 = time.perf_counter()
            report = JobRunner(job, cfg, echo=lambda m: None).run(1)
            wall = time.perf_counter() - t0
            after_driver = _driver_counts()
            driver = {k: (getattr(after_driver, k) - getattr(before_driver, k)) if after_driver else 0 for k in KINDS}
            total = {k: proxy.by_kind.get(k, 0) - before_total.get(k, 0) for k in (*KINDS, "other")}
            done = report.completed
            if len(done) != 1 or done[-1].epoch != int(T0.timestamp()) // EPOCH_S + e:
                raise RuntimeError(f"epoch {e}: expected one completed checkpoint, got {[r.epoch for r in done]}")
            runner = JobRunner(job, cfg, echo=lambda m: None)
            md = runner.coordinator.store.latest()
            stats = getattr(md.metadata.stats, "s3_requests", None) if md is not None and md.metadata.stats else None
            row = {"epoch": e, "checkpoint": done[-1].checkpoint_id, "wall_s": round(wall, 2),
                   "total": total, "driver": driver,
                   "executors": {k: total[k] - driver[k] for k in KINDS},
                   "stats": stats.to_dict() if stats is not None else None}
            out.append(row)
            echo(_line(row))
    finally:
        proxy.stop()
        moto.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out


def _line(r: dict) -> str:
    t = r["total"]
    return (f"{r['epoch']:5d} " + " ".join(f"{t[k]:6d}" for k in KINDS)
            + f" {sum(t[k] for k in KINDS):6d} | {sum(r['driver'].values()):6d} {sum(r['executors'].values()):6d}"
            + f" | {r['driver']['list']:5d} {r['executors']['list']:5d} | {r['wall_s']:6.2f}")


HEADER = ("epoch   LIST    GET   HEAD    PUT DELETE  total | driver  exec. | LIST: drv  exec. | wall s")


def summary(rows: list[dict]) -> str:
    k = min(10, max(1, len(rows) // 3))
    first, last = rows[1:1 + k], rows[-k:]  # epoch 0 includes job creation

    def mean(rs: list[dict], part: str, kind: str | None) -> float:
        vals = [(r[part][kind] if kind else sum(r[part][x] for x in KINDS)) for r in rs]
        return sum(vals) / max(1, len(vals))
    lines = [f"mean per epoch, epochs {first[0]['epoch']}-{first[-1]['epoch']} -> "
             f"{last[0]['epoch']}-{last[-1]['epoch']}:"]
    for kind in (*KINDS, None):
        lines.append(f"  {(kind or 'total').upper():7s} total {mean(first, 'total', kind):7.1f} -> "
                     f"{mean(last, 'total', kind):7.1f}   driver {mean(first, 'driver', kind):7.1f} -> "
                     f"{mean(last, 'driver', kind):7.1f}")
    xs = [r["epoch"] for r in rows[1:]]
    ys = [r["total"]["list"] for r in rows[1:]]
    if len(xs) > 1:
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(1e-9, sum((x - mx) ** 2 for x in xs))
        lines.append(f"  LIST slope: {slope * 100:+.1f} requests per epoch per 100 epochs of history")
    return "\n".join(lines)


def plot(png: str, files: list[str]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for f in files:
        data = json.loads(Path(f).read_text())
        label = data.get("label") or Path(f).stem
        rows = data["epochs"]
        xs = [r["epoch"] for r in rows]
        for kind, ls in (("list", "-"), ("get", "--"), ("put", ":")):
            ax.plot(xs, [r["total"][kind] for r in rows], ls, marker=".", label=f"{kind.upper()} ({label})")
        ax.plot(xs, [sum(r["total"][k] for k in KINDS) for r in rows], "-", lw=2, label=f"all ({label})")
    ax.set(xlabel="epoch", ylabel="S3 requests in the epoch", title="S3 requests per epoch vs history")
    ax.grid(alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--rows", type=int, default=200, help="rows per epoch (all partitions)")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--label", default="")
    ap.add_argument("--page-size", type=int, default=0,
                    help="keys per LIST page of the driver (default S3's 1000): a scale model of a longer history")
    ap.add_argument("--out", default="", help="write the per-epoch counts as JSON here")
    ap.add_argument("--plot", nargs="+", metavar=("PNG", "JSON"), help="plot earlier --out files into PNG")
    args = ap.parse_args()
    if args.plot:
        plot(args.plot[0], args.plot[1:])
        return
    print(f"{args.epochs} epochs, {args.rows} rows per epoch in {args.partitions} partitions, parallelism "
          f"{args.parallelism}, moto S3, LIST pages of {args.page_size or 1000} keys; requests per epoch "
          f"(total = driver + executors, counted at a proxy)")
    print(HEADER)
    rows = run(args.epochs, args.rows, args.partitions, args.parallelism, page_size=args.page_size)
    print(summary(rows))
    if args.out:
        Path(args.out).write_text(json.dumps({"label": args.label, "epochs": rows}, indent=1))


if __name__ == "__main__":
    main()
