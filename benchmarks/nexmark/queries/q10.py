"""Nexmark q10, log to a file system: every bid into a table partitioned by date and hour-minute
(``dt`` = yyyy-MM-dd, ``hm`` = HH:mm of ``date_time``, UTC)."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from pipeline import Job

SINK = "q10"


def job() -> Job:
    j = Job("nexmark_q10")
    source(j, "bid").select("auction", "bidder", "price", "date_time", "extra",
                            "date_format(date_time, 'yyyy-MM-dd') AS dt",
                            "date_format(date_time, 'HH:mm') AS hm").sink(SINK, partition_by=["dt", "hm"])
    return j


def reference() -> str:
    return """SELECT auction, bidder, price, date_time, extra, strftime(date_time, '%Y-%m-%d') AS dt,
                     strftime(date_time, '%H:%M') AS hm FROM bid"""
