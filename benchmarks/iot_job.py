"""A dedup-heavy IoT job (not the demo): the shape that made ``validate`` slow (issue 29), with its data generator.

    readings ─ deduplicate(reading_dedup, reading_id: one key per row) ─┬─ join(reading_id, ack_join) ─┬─ sink acked_readings (Delta)
    acks ───── deduplicate(ack_dedup, ack_id: one key per row) ─────────┘                               └─ window(device_id, 60 s,
                                                                                                           emit="update") ─> sink device_minutes (Iceberg, upsert)
    readings (deduplicated) ─ process(device_alerts, device_id) ─> sink alerts (Delta)

Every id is unique but for ``RESEND`` of the rows, which a client sends again (same id, a later ``_ingest_ts``, any
partition): the dedups drop those. Each reading has one ack, most in the same epoch, some one or two epochs later.

Run it as a user would (the module on ``PYTHONPATH``; the repository root is, for ``python -m``)::

    python -m benchmarks.iot_job generate --root /tmp/iot --events 7600 --epochs 24
    PIPELINE_SOURCE_URI=file:///tmp/iot/sources PIPELINE_CHECKPOINT_URI=file:///tmp/iot/ckpt \\
      PIPELINE_SINK_URI=file:///tmp/iot/sinks python -m pipeline run --job benchmarks.iot_job:build_job --epochs 24
    ... python -m pipeline validate --job benchmarks.iot_job:build_job --checkpoint 24
"""
from __future__ import annotations

import argparse
import os
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import Job

__all__ = ["READINGS", "ACKS", "ALERT_STATE", "ALERTS", "build_job", "threshold_alerts",
           "generate"]

TS = pa.timestamp("us", tz="UTC")
READINGS = pa.schema([("reading_id", pa.string()), ("device_id", pa.string()), ("value", pa.float64()),
                      ("event_time", TS), ("_ingest_ts", TS)])
ACKS = pa.schema([("ack_id", pa.string()), ("reading_id", pa.string()), ("gateway", pa.string()),
                  ("_ingest_ts", TS)])
ALERT_STATE = pa.schema([("device_id", pa.string()), ("alerts", pa.int64())])
ALERTS = pa.schema([("device_id", pa.string()), ("reading_id", pa.string()), ("value", pa.float64()),
                    ("alert_no", pa.int64()), ("_ingest_ts", TS)])
THRESHOLD = 90.0
EPOCH_SECONDS = 60
T0 = datetime(2026, 1, 5, tzinfo=UTC)
RESEND = 0.02


def threshold_alerts(rows: pa.Table, state: pa.Table) -> tuple[pa.Table, pa.Table]:
    """``process`` function: every reading above :data:`THRESHOLD` is an alert, numbered per device (the state keeps
    the device's alert count). Vectorised: rows come sorted by device, then ``_ingest_ts``."""
    hot = rows.filter(pc.greater(rows["value"], THRESHOLD))
    devices = pc.unique(rows["device_id"])
    before = dict(zip(state["device_id"].to_pylist(), state["alerts"].to_pylist()))
    dev = hot["device_id"].to_numpy(zero_copy_only=False)
    # the alert's number: the device's count so far + its rank among this call's hot rows of the device
    n = np.zeros(len(dev), np.int64)
    if len(dev):
        starts = np.r_[True, dev[1:] != dev[:-1]]
        idx = np.arange(len(dev))
        first = np.maximum.accumulate(np.where(starts, idx, 0))
        n = idx - first + 1 + np.asarray([before.get(d, 0) for d in dev], np.int64)
    out = pa.table({"device_id": hot["device_id"], "reading_id": hot["reading_id"], "value": hot["value"],
                    "alert_no": pa.array(n, pa.int64()), "_ingest_ts": hot["_ingest_ts"]}, schema=ALERTS)
    counts = dict(before)
    for d, k in zip(dev.tolist(), n.tolist()):
        counts[d] = max(counts.get(d, 0), int(k))
    ds = devices.to_pylist()
    new_state = pa.table({"device_id": pa.array(ds, pa.string()),
                          "alerts": pa.array([counts.get(d, 0) for d in ds], pa.int64())}, schema=ALERT_STATE)
    return new_state, out


def build_job(name: str = "iot_dedup") -> Job:
    """The job of the module docstring (Delta and Iceberg sinks)."""
    job = Job(name, max_parallelism=32)
    readings = job.source("readings", READINGS, key="reading_id")
    acks = job.source("acks", ACKS, key="ack_id")
    unique_readings = readings.deduplicate(uid="reading_dedup", key="reading_id", ttl_seconds=3600)
    unique_acks = acks.deduplicate(uid="ack_dedup", key="ack_id", ttl_seconds=3600)
    acked = unique_readings.join(unique_acks.select("ack_id", "reading_id", "gateway"), on="reading_id",
                                 uid="ack_join")
    acked.sink("acked_readings", format="delta")
    acked.window(uid="device_minutes", key="device_id", event_time="event_time", size_seconds=60,
                 max_out_of_orderness_seconds=10, allowed_lateness_seconds=0, emit="update",
                 aggs={"readings": ("count", None), "avg_value": ("avg", "value"), "max_value": ("max", "value")}
                 ).sink("device_minutes", mode="upsert", format="iceberg")
    unique_readings.process(uid="device_alerts", key="device_id", fn=threshold_alerts, state_schema=ALERT_STATE,
                            output_schema=ALERTS).sink("alerts", format="delta")
    return job


def _write(root: str, source: str, part: int, seq: int, table: pa.Table) -> None:
    import pyarrow.parquet as pq
    d = os.path.join(root, source, f"partition={part}")
    os.makedirs(d, exist_ok=True)
    pq.write_table(table, os.path.join(d, f"{seq:08d}.parquet"))


def generate(root: str, *, events: int, epochs: int = 24, partitions: int = 2, devices: int = 50,
             seed: int = 7, epoch_seconds: int = EPOCH_SECONDS) -> dict:
    """Write ``events`` readings (+ one ack each, + :data:`RESEND` re-sent copies of both) over ``epochs`` epochs
    into ``<root>`` (the source layout: ``<source>/partition=<p>/<seq>.parquet``, one file per epoch and partition).
    Returns counts."""
    rng = np.random.default_rng(seed)
    E = epoch_seconds * 1_000_000
    t0 = int(T0.timestamp()) * 1_000_000
    per = max(1, events // epochs)
    rows_r: dict[int, list[tuple]] = {}
    rows_a: dict[int, list[tuple]] = {}
    i = 0
    for e in range(epochs):
        for _ in range(per):
            ing = t0 + e * E + int(rng.integers(0, E))
            et = ing - int(rng.integers(0, 20_000_000))
            rid = f"r{i:09d}"
            dev = f"d{int(rng.integers(0, devices)):04d}"
            val = float(np.round(rng.normal(60, 15), 3))
            p = int(rng.integers(0, partitions))
            rows_r.setdefault(p, []).append((rid, dev, val, et, ing))
            if rng.random() < RESEND:   # the client re-sends it a little later, maybe to another partition
                rows_r.setdefault(int(rng.integers(0, partitions)), []).append(
                    (rid, dev, val, et, ing + int(rng.integers(1, E // 2))))
            lag = int(rng.choice([0, 0, 0, 0, 0, 0, 1, 2]))
            ack_ing = min(ing + lag * E + int(rng.integers(1, E // 4)), t0 + epochs * E - 1)
            aid = f"a{i:09d}"
            gw = f"g{int(rng.integers(0, 8))}"
            pa_ = int(rng.integers(0, partitions))
            rows_a.setdefault(pa_, []).append((aid, rid, gw, ack_ing))
            if rng.random() < RESEND:
                rows_a.setdefault(int(rng.integers(0, partitions)), []).append(
                    (aid, rid, gw, min(ack_ing + int(rng.integers(1, E // 2)), t0 + epochs * E - 1)))
            i += 1
    files = 0
    for source, parts, schema in (("readings", rows_r, READINGS), ("acks", rows_a, ACKS)):
        for p in range(partitions):
            rows = sorted(parts.get(p, []), key=lambda r: r[-1])
            by_epoch: dict[int, list[tuple]] = {}
            for r in rows:
                by_epoch.setdefault((r[-1] - t0) // E, []).append(r)
            for seq, e in enumerate(sorted(by_epoch)):
                cols = list(zip(*by_epoch[e]))
                arrays = []
                for f, c in zip(schema, cols):
                    if pa.types.is_timestamp(f.type):
                        arrays.append(pa.array(np.asarray(c, np.int64), pa.int64()).cast(TS))
                    else:
                        arrays.append(pa.array(list(c), f.type))
                _write(root, source, p, seq, pa.Table.from_arrays(arrays, schema=schema))
                files += 1
    return {"readings": sum(len(v) for v in rows_r.values()), "acks": sum(len(v) for v in rows_a.values()),
            "files": files, "epochs": epochs, "epoch_seconds": epoch_seconds,
            "t0": T0.isoformat()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--root", required=True, help="local directory: the source root")
    g.add_argument("--events", type=int, default=7600)
    g.add_argument("--epochs", type=int, default=24)
    g.add_argument("--partitions", type=int, default=2)
    g.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    print(generate(a.root, events=a.events, epochs=a.epochs, partitions=a.partitions, seed=a.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
