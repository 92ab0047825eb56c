"""Nexmark q11, user sessions: bids per bidder in sessions closed by 10 seconds without a bid (Flink's
``SESSION(dateTime, INTERVAL '10' SECOND)``). Watermark: ``date_time`` - 4 s, as Nexmark's DDL; a session is
emitted once the watermark passes its last bid + 10 s (docs/operators.md "Session windows")."""
from __future__ import annotations

from benchmarks.nexmark.queries import WATERMARK_DELAY_SECONDS, source
from benchmarks.nexmark.reference import session_rows
from pipeline import Job

SINK = "q11"


def job() -> Job:
    j = Job("nexmark_q11")
    (source(j, "bid").select("bidder", "date_time")
     .session_window(uid="q11_bidder_sessions", key="bidder", event_time="date_time", gap_seconds=10,
                     max_out_of_orderness_seconds=WATERMARK_DELAY_SECONDS, aggs={"bid_count": ("count", None)})
     .select("bidder", "bid_count", "window_start AS starttime", "window_end AS endtime").sink(SINK))
    return j


def reference() -> str:
    s = session_rows("bid", key="bidder", event_time="date_time", gap=10, out_of_orderness=WATERMARK_DELAY_SECONDS)
    return f"""SELECT bidder, count(*) AS bid_count, window_start AS starttime, window_end AS endtime
               FROM {s} GROUP BY bidder, window_start, window_end"""
