"""Nexmark q12, processing-time windows: bids per bidder in 10-second tumbling windows of processing time.
Epochal's processing time is the arrival time ``_ingest_ts`` (deterministic on replay, unlike a wall clock), so
the window runs on ``_ingest_ts`` with no out-of-orderness (it never decreases within a partition)."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from benchmarks.nexmark.reference import window_pairs
from pipeline import Job

SINK = "q12"


def job() -> Job:
    j = Job("nexmark_q12")
    (source(j, "bid").select("bidder", "_ingest_ts AS p_time")
     .window(uid="q12_bidder_windows", key="bidder", event_time="p_time", size_seconds=10,
             aggs={"bid_count": ("count", None)})
     .select("bidder", "bid_count", "window_start AS starttime", "window_end AS endtime").sink(SINK))
    return j


def reference() -> str:
    w = window_pairs("(SELECT bidder, _ingest_ts AS p_time, _channel, _epoch FROM bid)", key="bidder",
                     event_time="p_time", size=10)
    return f"""SELECT bidder, count(*) AS bid_count, window_start AS starttime, window_end AS endtime
               FROM {w} GROUP BY bidder, window_start, window_end"""
