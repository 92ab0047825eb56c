"""Test jobs built only from the public job API (never the demo): clicks x views on ``ad_id``.

Keys repeat on both sides, across epochs and partitions; the two raw sources are joined directly."""
from __future__ import annotations

import os

import pyarrow as pa

from pipeline import Job

TS = pa.timestamp("us", tz="UTC")
CLICKS = pa.schema([("click_id", pa.string()), ("ad_id", pa.string()), ("_ingest_ts", TS)])
VIEWS = pa.schema([("view_id", pa.string()), ("ad_id", pa.string()), ("_ingest_ts", TS)])
TTL = 150


def build() -> Job:
    job = Job("clicks_views", max_parallelism=16)
    clicks = job.source("clicks", CLICKS, key="ad_id")
    views = job.source("views", VIEWS, key="ad_id")
    how = os.environ.get("TEST_JOIN_HOW", "inner")
    clicks.join(views, on="ad_id", uid="cv_join", how=how, ttl_seconds=TTL).sink("click_views")
    return job


def build_unique_views() -> Job:
    """Declares views unique per ad_id (which the data breaks): violations must be dead-lettered."""
    job = Job("clicks_views_u", max_parallelism=16)
    clicks = job.source("clicks", CLICKS, key="ad_id")
    views = job.source("views", VIEWS, key="ad_id")
    clicks.join(views, on="ad_id", uid="cv_join", unique="right", ttl_seconds=TTL).sink("click_views")
    return job


def build_dedup_join() -> Job:
    """Chained stateful operators: the first click per ad within the TTL, joined with the views. The dedup feeds
    the join's *right* input: Spark then runs its tasks as partitions P..2P-1 of a union, so a task that took
    its subtask from the partition id would restore the wrong key groups and let duplicates through (a defect
    found with ad_clicks; the tasks read their subtask from a beacon row, runtime/spark/routing.py)."""
    job = Job("first_clicks", max_parallelism=16)
    clicks = job.source("clicks", CLICKS, key="ad_id")
    views = job.source("views", VIEWS, key="ad_id")
    first = clicks.deduplicate(uid="first_click", key="ad_id", ttl_seconds=TTL)
    views.join(first, on="ad_id", uid="fv_join", ttl_seconds=TTL).sink("first_click_views")
    return job
