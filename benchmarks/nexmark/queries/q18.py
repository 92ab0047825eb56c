"""Nexmark q18, find last bid: each bidder's latest bid per auction (``ROW_NUMBER() OVER (PARTITION BY bidder,
auction ORDER BY date_time DESC) = 1``).

``keep_last`` keyed by (bidder, auction): an updating stream, one row per key, in an upsert sink keyed by both. The
engine breaks ties on ``date_time`` by ``_ingest_ts`` (the later arrival wins), then the other columns
(docs/operators.md "Top-N"); the reference spells that order out, since SQL leaves ties unspecified."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from pipeline import Job

SINK = "q18"
COLUMNS = ("auction", "bidder", "price", "channel", "url", "date_time", "extra")


def job() -> Job:
    j = Job("nexmark_q18")
    (source(j, "bid").keep_last(uid="q18_last_bid", key=["bidder", "auction"], order_by="date_time")
     .select(*COLUMNS)
     .sink(SINK, mode="upsert", key=["bidder", "auction"]))
    return j


def reference() -> str:
    return """SELECT auction, bidder, price, channel, url, date_time, extra FROM (
                SELECT *, row_number() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC NULLS LAST,
                         _ingest_ts DESC NULLS LAST, price ASC NULLS LAST, channel ASC NULLS LAST,
                         url ASC NULLS LAST, extra ASC NULLS LAST) AS rn FROM bid)
              WHERE rn = 1"""
