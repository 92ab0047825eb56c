"""Nexmark q10, log to a file system: every bid into a table partitioned by date and hour-minute
(``dt`` = yyyy-MM-dd, ``hm`` = HH:mm of ``date_time``, UTC)."""
from __future__ import annotations

import inspect

from benchmarks.nexmark.queries import NotExpressible, source
from pipeline import Job, Stream

SINK = "q10"


def job() -> Job:
    # TODO(issue 28 item 3): Stream.sink has no partition_by yet; until it has, the runner reports q10 as
    # "not expressible yet: a sink partitioned by columns". The job below is the query as written for it.
    if "partition_by" not in inspect.signature(Stream.sink).parameters:
        raise NotExpressible("a sink partitioned by columns (Stream.sink(..., partition_by=['dt', 'hm']))")
    j = Job("nexmark_q10")
    source(j, "bid").select("auction", "bidder", "price", "date_time", "extra",
                            "date_format(date_time, 'yyyy-MM-dd') AS dt",
                            "date_format(date_time, 'HH:mm') AS hm").sink(SINK, partition_by=["dt", "hm"])  # type: ignore[call-arg]
    return j


def reference() -> str:
    return """SELECT auction, bidder, price, date_time, extra, strftime(date_time, '%Y-%m-%d') AS dt,
                     strftime(date_time, '%H:%M') AS hm FROM bid"""
