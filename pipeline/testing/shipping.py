"""A small two-source job of the tests' own making (not the demo), its source data and a pandas oracle.

shipments JOIN ok-deliveries on ``ship_id`` -> ``delivered`` (append); per-carrier count and weight ->
``carrier_totals`` (upsert). ``python -m pipeline run --job pipeline.testing.shipping:build_job`` runs it
(the sinks' format then comes from ``PIPELINE_SINK_FORMAT`` or the default).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.job import Job

__all__ = ["build_job", "write_sources", "oracle", "SHIP", "DELIV", "EPOCH_S", "T0"]

TS = pa.timestamp("us", tz="UTC")
SHIP = pa.schema([("ship_id", pa.string()), ("carrier", pa.string()), ("weight", pa.float64()),
                  ("_ingest_ts", TS)])
DELIV = pa.schema([("ship_id", pa.string()), ("ok", pa.bool_()), ("_ingest_ts", TS)])
EPOCH_S = 60
T0 = pd.Timestamp("2026-01-01T00:00:00Z")


def build_job(fmt: str | None = None, *, extra: str | None = None) -> Job:
    job = Job("shipping")
    ships = job.source("shipments", SHIP, key="ship_id")
    deliv = job.source("deliveries", DELIV, key="ship_id").filter("ok")
    sel = ["ship_id", "carrier", "weight"] + ([f"{extra}"] if extra else [])
    joined = ships.select(*sel).join(deliv.select("ship_id", "ok"), on="ship_id", uid="deliv_join")
    joined.sink("delivered", format=fmt)
    joined.aggregate(uid="carrier_agg", key="carrier",
                     aggs={"n": ("count", None), "kg": ("sum", "weight")}).sink("carrier_totals", mode="upsert",
                                                                              format=fmt)
    return job


def write_sources(root: Path, epochs: int = 4, per_epoch: int = 40) -> None:
    for e in range(epochs):
        for p in range(2):
            ids = [f"s{e}-{p}-{i}" for i in range(per_epoch)]
            ts = [T0 + pd.Timedelta(seconds=e * EPOCH_S + i) for i in range(per_epoch)]
            ship = pa.table({"ship_id": ids, "carrier": [f"c{(i * 7 + e) % 5}" for i in range(per_epoch)],
                             "weight": [float(i % 13) + 0.5 for i in range(per_epoch)],
                             "_ingest_ts": pa.array(ts, TS)}, schema=SHIP)
            # one delivery per shipment, in the other partition; every third arrives an epoch later
            dids = [f"s{e}-{1 - p}-{i}" if i % 3 else f"s{e - 1}-{1 - p}-{i}" for i in range(per_epoch)
                    if i % 3 or e > 0]
            dl = pa.table({"ship_id": dids, "ok": [int(d.rsplit("-", 1)[1]) % 4 != 1 for d in dids],
                           "_ingest_ts": pa.array(ts[:len(dids)], TS)}, schema=DELIV)
            for name, t in (("shipments", ship), ("deliveries", dl)):
                d = root / name / f"partition={p}"
                d.mkdir(parents=True, exist_ok=True)
                pq.write_table(t, d / f"{e:08d}.parquet")


def oracle(root: Path, upto_epoch: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Independent recomputation with pandas over the source files of epochs <= upto_epoch."""
    def load(name):
        t = pd.concat([pd.read_parquet(f) for f in sorted((root / name).rglob("*.parquet"))])
        # epochs are numbered from the unix epoch in EPOCH_S slices
        return t[t["_ingest_ts"] < pd.Timestamp((upto_epoch + 1) * EPOCH_S, unit="s", tz="UTC")]
    ships, deliv = load("shipments"), load("deliveries")
    deliv = deliv[deliv["ok"]]
    j = ships.merge(deliv[["ship_id"]], on="ship_id")[["ship_id", "carrier", "weight"]]
    tot = j.groupby("carrier").agg(n=("ship_id", "count"), kg=("weight", "sum")).reset_index()
    return j.sort_values("ship_id").reset_index(drop=True), tot.sort_values("carrier").reset_index(drop=True)
