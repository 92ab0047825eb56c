"""Nexmark q8, monitor new users: people who opened an auction in the same 10-second window in which they
registered (a tumbling window per person id, one per seller, joined on id and window). Watermark:
``date_time`` - 4 s, as Nexmark's DDL."""
from __future__ import annotations

from benchmarks.nexmark.queries import WATERMARK_DELAY_SECONDS, source
from benchmarks.nexmark.reference import window_pairs
from pipeline import Job

SINK = "q8"


def job() -> Job:
    j = Job("nexmark_q8")
    persons = source(j, "person").window(
        uid="q8_person_windows", key="id", event_time="date_time", size_seconds=10,
        max_out_of_orderness_seconds=WATERMARK_DELAY_SECONDS, aggs={"name": ("max", "name")})
    sellers = source(j, "auction").window(
        uid="q8_seller_windows", key="seller", event_time="date_time", size_seconds=10,
        max_out_of_orderness_seconds=WATERMARK_DELAY_SECONDS, aggs={"auctions": ("count", None)}
    ).select("seller AS id", "window_start", "window_end")
    (persons.join(sellers, on=["id", "window_start", "window_end"], uid="q8_join")
     .select("id", "name", "window_start AS starttime").sink(SINK))
    return j


def reference() -> str:
    def w(inp: str, key: str) -> str:
        return window_pairs(inp, key=key, event_time="date_time", size=10, out_of_orderness=WATERMARK_DELAY_SECONDS)
    return f"""WITH P AS (SELECT id, max(name) AS name, window_start, window_end
                          FROM {w('person', 'id')} GROUP BY id, window_start, window_end),
                    A AS (SELECT DISTINCT seller, window_start, window_end
                          FROM {w('auction', 'seller')})
               SELECT P.id, P.name, P.window_start AS starttime
               FROM P JOIN A ON P.id = A.seller AND P.window_start = A.window_start AND P.window_end = A.window_end"""
