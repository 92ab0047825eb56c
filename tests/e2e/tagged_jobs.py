"""Jobs and sources of the state tests' own making, with what they share (one Parquet file per epoch and partition,
a JobRunner on local directories, every state table of a checkpoint read cold):

* ``tagged_job`` (tests/integration/test_epoch_tagging.py and tests/e2e/test_epoch_tagging_crash.py): deduplicate ->
  left join with TTL -> running aggregate, an append and an upsert sink.
  ``python -m pipeline run --job tagged_jobs:tagged_job`` with tests/e2e on ``PYTHONPATH``;
* ``window_job``: a sliding event-time window with late records and an aggregate chained over it;
* ``sightings_job`` (tests/integration/test_rocksdb_state.py): a dedup with a TTL chained into a full outer join
  with a TTL, and a running aggregate; keys repeat on both sides, across epochs and partitions.
"""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.job import Job

TS = pa.timestamp("us", tz="UTC")
VIEWS = pa.schema([("vid", pa.string()), ("user", pa.string()), ("_ingest_ts", TS)])
BUYS = pa.schema([("bid", pa.string()), ("vid", pa.string()), ("amount", pa.int64()), ("_ingest_ts", TS)])
T0 = datetime(2024, 5, 1, tzinfo=UTC)
EPOCHS, PER_EPOCH = 5, 40
SIGHTINGS = pa.schema([("sid", pa.string()), ("tag", pa.string()), ("_ingest_ts", TS)])
TAGS = pa.schema([("tid", pa.string()), ("tag", pa.string()), ("w", pa.int64()), ("_ingest_ts", TS)])
SIGHTING_EPOCHS, SIGHTINGS_PER_EPOCH = 3, 40


def write_epoch_file(root: Path, source: str, partition: int, epoch: int, cols: dict, schema: pa.Schema) -> None:
    """Epoch ``epoch``'s rows of ``source`` partition ``partition``: one Parquet file named by the epoch."""
    d = root / source / f"partition={partition}"
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols, schema=schema), d / f"{epoch:08d}.parquet")


def tagged_job(windows: bool = False) -> Job:
    """``windows``: also the branch of :func:`window_job` over the same views (one job, both kinds of operators)."""
    job = Job("tagged_rounds", max_parallelism=16)
    views = job.source("views", VIEWS, key="vid")
    buys = job.source("buys", BUYS, key="vid")
    seen = views.deduplicate(uid="seen", key="vid", ttl_seconds=150)
    j = seen.join(buys.select("vid", "amount"), on="vid", uid="j", how="left", ttl_seconds=150)
    j.sink("joined")
    j.aggregate(uid="per-user", key="user", aggs={"n": ("count", None), "total": ("sum", "amount")}).sink(
        "user_totals", mode="upsert", key=["user"])
    if windows:
        _windows(views)
    return job


def _windows(views) -> None:
    w = views.select("vid", "user", "length(vid) AS len",
                     "timestamp_micros(unix_micros(_ingest_ts) - pmod(hash(vid), 150000000)) AS et").window(
        uid="w", key="user", event_time="et", size_seconds=60, slide_seconds=30, max_out_of_orderness_seconds=15,
        allowed_lateness_seconds=10, aggs={"n": ("count", None), "chars": ("sum", "len"), "longest": ("max", "len")})
    w.sink("user_windows")
    w.aggregate(uid="windows-per-user", key="user", aggs={"windows": ("count", None), "views": ("sum", "n")}).sink(
        "window_totals", mode="upsert", key=["user"])


def window_job() -> Job:
    """Views per user in sliding event-time windows (60 s, sliding by 30 s): event times run up to 150 s behind the
    ingest time, so records arrive out of order and some late (dead letters); an aggregate counts the fired
    windows per user (chained: the window's output flows on)."""
    job = Job("tagged_windows", max_parallelism=16)
    _windows(job.source("views", VIEWS, key="vid"))
    return job


def write_source(root: Path) -> str:
    for e in range(EPOCHS):
        for p in range(2):
            n = PER_EPOCH // 2
            vids = [f"v{e}-{p}-{i}" for i in range(n)]
            vids[:2] = [f"v{max(0, e - 1)}-{p}-{i}" for i in range(2)]  # repeats of the previous epoch: dropped
            write_epoch_file(root, "views", p, e, {
                "vid": vids, "user": [f"u{(i * 5 + e) % 7}" for i in range(n)],
                "_ingest_ts": [T0 + timedelta(seconds=60 * e + 55 * i / n) for i in range(n)]}, VIEWS)
            # buys of views of this or the previous epochs (some never: unmatched views leave at expiry)
            src = [(max(0, e - (i % 3)), (p + i) % 2, (i * 3) % n) for i in range(0, n, 2)]
            write_epoch_file(root, "buys", p, e, {
                "bid": [f"b{e}-{p}-{i}" for i in range(len(src))], "vid": [f"v{a}-{b}-{c}" for a, b, c in src],
                "amount": [i * 7 % 50 + 1 for i in range(len(src))],
                "_ingest_ts": [T0 + timedelta(seconds=60 * e + 50 * i / len(src)) for i in range(len(src))]}, BUYS)
    return root.as_uri()




def sightings_job() -> Job:
    job = Job("sightings_tags", max_parallelism=16)
    s = job.source("sightings", SIGHTINGS, key="tag")
    t = job.source("tags", TAGS, key="tag")
    first = s.deduplicate(uid="first_sighting", key="sid", ttl_seconds=150)
    first.join(t, on="tag", uid="st_join", how="full", ttl_seconds=150).sink("sighting_tags")
    t.aggregate(uid="per_tag", key="tag", aggs={"n": ("count", None), "w": ("sum", "w")}) \
        .sink("tag_totals", mode="upsert", key=["tag"])
    return job


def write_sightings(root: Path) -> str:
    """Sightings and tags: never-matched rows on both sides (they pile up and expire as outer rows)."""
    n = SIGHTINGS_PER_EPOCH
    for e in range(SIGHTING_EPOCHS):
        for p in range(2):
            ts = [T0 + timedelta(seconds=60 * e + 55 * i / n) for i in range(n)]
            left = [f"t{(i * 5 + e) % 13}" if i % 3 else f"never-{e}-{p}-{i}" for i in range(n)]
            right = [f"t{(i * 3 + 2 * e) % 13}" if i % 4 else f"lone-{e}-{p}-{i}" for i in range(n)]
            write_epoch_file(root, "sightings", p, e, {"sid": [f"s{p}-{(e * n + i) % 60}" for i in range(n)],
                                                       "tag": left, "_ingest_ts": ts}, SIGHTINGS)
            write_epoch_file(root, "tags", p, e, {"tid": [f"g{e}-{p}-{i}" for i in range(n)], "tag": right,
                                                  "w": [i * 10 + e for i in range(n)], "_ingest_ts": ts}, TAGS)
    return root.as_uri()


def local_runner(job: Job, tmp: Path, source: str, name: str, **kw: Any):
    """A JobRunner of ``job`` with its checkpoints and sinks under ``tmp/name``, 1-minute epochs, the clock an hour
    after ``T0``, parallelism 2 unless ``kw`` says otherwise."""
    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner
    cfg = load_config(env={}, source_uri=source, checkpoint_uri=(tmp / name / "ckpt").as_uri(),
                      sink_uri=(tmp / name / "sink").as_uri(), epoch_seconds=60,
                      clock_now=(T0 + timedelta(hours=1)).isoformat(), **{"parallelism": 2, **kw})
    return JobRunner(job, cfg, echo=lambda m: None)


def checkpoint_state(md) -> dict[str, list[str]]:
    """Every state table of a checkpoint, read cold from local storage (chains applied, checksums verified):
    ``{"<operator uid>/<state name>": sorted rows as JSON}``."""
    from pipeline.fileio import LocalFileIO
    from pipeline.runtime.driver.cursor import cursor_from_metadata
    from pipeline.state import backend
    backend._RECENT.clear()
    out = {}
    for uid, by_name in cursor_from_metadata(md).handles.items():
        for name, hs in by_name.items():
            live = [h for h in hs if h.file is not None]
            if live:
                schema = pq.read_schema(live[0].file.uri[len("file://"):])
                rows = backend.read_state(LocalFileIO(), live, 0, 15, schema, md.name).to_pylist()
                out[f"{uid}/{name}"] = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
    return out
