"""Jobs of the batch-equivalence tests (never the demo): built through the public job API only."""
from __future__ import annotations

import pyarrow as pa

from pipeline import Job

TS = pa.timestamp("us", tz="UTC")
LEFT = pa.schema([("k", pa.string()), ("grp", pa.string()), ("x", pa.float64()), ("_ingest_ts", TS)])
RIGHT = pa.schema([("k", pa.string()), ("y", pa.int64()), ("tag", pa.string()), ("_ingest_ts", TS)])


def join_agg(ttl_seconds: int = 150) -> Job:
    """Join with a short TTL, the join output summed per group, a raw source aggregated directly."""
    job = Job("bt_join_agg", max_parallelism=16)
    a = job.source("lefts", LEFT, key="k")
    b = job.source("rights", RIGHT, key="k")
    j = a.join(b.filter("tag <> 'drop'").select("k", "y", "tag AS rtag"), on="k", uid="lr-join",
               ttl_seconds=ttl_seconds)
    j.sink("pairs")
    j.aggregate(uid="per-grp", key="grp", aggs={"n": ("count", None), "xs": ("sum", "x"), "ys": ("sum", "y"),
                                                 "ymax": ("max", "y")}).sink("grp_totals", mode="upsert")
    a.aggregate(uid="raw-per-k", key="grp", aggs={"rows": ("count", None), "xmin": ("min", "x")}).sink(
        "raw_totals", mode="upsert")
    return job
