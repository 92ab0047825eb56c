"""Jobs of the bootstrap tests (never the demo): one bootstrap derives exactly, three it must refuse."""
from __future__ import annotations

import pyarrow as pa
from batch_jobs import LEFT, RIGHT

from pipeline import Job


def dedup_join() -> Job:
    """Deduplicate (TTL) feeding a left outer join (TTL: unmatched rows are emitted when they expire)."""
    job = Job("bt_boot_dedup_join", max_parallelism=8)
    a = job.source("lefts", LEFT, key="k")
    b = job.source("rights", RIGHT, key="k")
    d = a.deduplicate(uid="dd", key="k", ttl_seconds=90)
    d.join(b.select("k", "y", "tag AS rtag"), on="k", uid="dj", how="left", ttl_seconds=150).sink("dpairs")
    return job



def unique_join() -> Job:
    """A full outer join with keys declared unique on both sides (matched rows leave state on both sides), its
    output counted per key."""
    job = Job("bt_boot_unique_join", max_parallelism=8)
    a = job.source("lefts", LEFT, key="k")
    b = job.source("rights", RIGHT, key="k")
    j = a.join(b.filter("tag <> 'drop'").select("k", "y", "tag AS rtag"), on="k", uid="uj", how="full",
               unique="both", ttl_seconds=150)
    j.sink("upairs")
    # (keyed by the join key: an outer row's other-side columns are null, and a null group key is another story)
    j.aggregate(uid="u-per-k", key="k", aggs={"n": ("count", None)}).sink("u_totals", mode="upsert")
    return job


def window_job() -> Job:
    job = Job("bt_boot_window", max_parallelism=8)
    job.source("lefts", LEFT, key="k").window(uid="win-grp", key="grp", event_time="_ingest_ts", size_seconds=60,
                                              aggs={"n": ("count", None)}).sink("per_minute")
    return job


def process_job() -> Job:
    def fn(rows, state):
        return state, rows.select(["k", "x"])
    job = Job("bt_boot_process", max_parallelism=8)
    job.source("lefts", LEFT, key="k").process(
        uid="user-fn", key="k", fn=fn, state_schema=pa.schema([("k", pa.string())]),
        output_schema=pa.schema([("k", pa.string()), ("x", pa.float64())])).sink("out")
    return job


def append_agg_job() -> Job:
    job = Job("bt_boot_changelog", max_parallelism=8)
    job.source("lefts", LEFT, key="k").aggregate(uid="per-grp", key="grp", aggs={"n": ("count", None)}).sink(
        "changes")
    return job
