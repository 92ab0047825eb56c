"""Jobs of the bootstrap tests (never the demo): the ones bootstrap derives exactly, three it must refuse."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
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


def window_of_updates() -> Job:
    """A window over an ``emit="update"`` window's changelog: the one window shape bootstrap refuses."""
    job = Job("bt_boot_window_of_updates", max_parallelism=8)
    w = job.source("lefts", LEFT, key="k").window(uid="win-grp", key="grp", event_time="_ingest_ts", size_seconds=60,
                                                  aggs={"n": ("count", None)}, emit="update")
    w.window(uid="win-of-win", key="grp", event_time="window_start", size_seconds=120,
             aggs={"n": ("sum", "n")}).sink("per_2min")
    return job


LIMITS = pa.schema([("k", pa.string()), ("lim", pa.float64()), ("_ingest_ts", pa.timestamp("us", tz="UTC"))])


def write_limits(root: Path, epoch: int) -> None:
    """Epoch ``epoch``'s file of the ``limits`` source (one partition, 3 sensors' new limits, as ``write_epoch``)."""
    from state_jobs import E_US, T0
    t = pa.table({"k": [f"k{(epoch * 5 + i) % 12:02d}" for i in range(3)], "lim": [10.0 + epoch + i for i in range(3)],
                  "_ingest_ts": pa.array([T0 + epoch * E_US + (i + 1) * 15_000_000 for i in range(3)],
                                         pa.int64()).cast(pa.timestamp("us", tz="UTC"))}, schema=LIMITS)
    d = root / "limits" / "partition=0"
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, d / f"{epoch:08d}.parquet")


def sensor_windows(name: str = "bt_boot_sensors") -> Job:
    """Sensor readings (``tests/batch/state_jobs.py`` data: sensor ``k``, group ``g``, value ``v``, event time ``et``
    up to 100 s behind arrival, partition 1 idle for one epoch): deduplicated per sensor (TTL 90 s) into ``firsts``;
    sliding windows (60 s every 30 s, out-of-orderness 20 s, lateness 30 s, ``emit="final"``) per group over the
    deduplicated readings; tumbling 120 s windows per sensor over the raw readings (out-of-orderness 10 s,
    ``emit="update"`` into an upsert sink); late records of both are dead-lettered; the readings joined with the
    sensors' limits (a second source, TTL 120 s), tumbling 60 s windows per group over the join output
    (``emit="final"``, watermark channel ``op:jl``)."""
    from state_jobs import EVENTS
    job = Job(name, max_parallelism=16)
    ev = job.source("events", EVENTS)
    lim = job.source("limits", LIMITS)
    ev.join(lim.select("k", "lim"), on="k", uid="jl", ttl_seconds=120).window(
        uid="over", key="g", event_time="et", size_seconds=60, max_out_of_orderness_seconds=30,
        aggs={"n": ("count", None), "lmax": ("max", "lim"), "vs": ("sum", "v")}).sink("per_limit")
    firsts = ev.deduplicate(uid="dd", key="k", ttl_seconds=90)
    firsts.sink("firsts")
    firsts.window(uid="slide", key="g", event_time="et", size_seconds=60, slide_seconds=30,
                  max_out_of_orderness_seconds=20, allowed_lateness_seconds=30,
                  aggs={"n": ("count", None), "vs": ("sum", "v"), "vmax": ("max", "v"), "ks": ("count_distinct", "k")},
                  emit="final").sink("wins")
    ev.window(uid="tumble", key="k", event_time="et", size_seconds=120, max_out_of_orderness_seconds=10,
              aggs={"n": ("count", None), "vs": ("sum", "v"), "vmin": ("min", "v")}, emit="update").sink(
        "wins_u", mode="upsert")
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
