"""Nexmark q19, auction top-10 price: the 10 highest bids of each auction (``ROW_NUMBER() OVER (PARTITION BY
auction ORDER BY price DESC) <= 10``).

``top_n`` keyed by auction, ``n=10``: an updating stream keyed by (auction, rank_number) in an upsert sink keyed by
both. Ties on price are broken by ``_ingest_ts`` (the later arrival first), then the other columns
(docs/operators.md "Top-N"); the reference spells that order out, since SQL leaves ties unspecified."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from pipeline import Job

SINK = "q19"
COLUMNS = ("auction", "bidder", "price", "channel", "url", "date_time", "extra", "rank_number")


def job() -> Job:
    j = Job("nexmark_q19")
    (source(j, "bid").top_n(uid="q19_top10", key="auction", order_by="price DESC", n=10)
     .select(*COLUMNS)
     .sink(SINK, mode="upsert", key=["auction", "rank_number"]))
    return j


def reference() -> str:
    return """SELECT auction, bidder, price, channel, url, date_time, extra, rank_number FROM (
                SELECT *, row_number() OVER (PARTITION BY auction ORDER BY price DESC NULLS LAST,
                         _ingest_ts DESC NULLS LAST, bidder ASC NULLS LAST, channel ASC NULLS LAST,
                         url ASC NULLS LAST, date_time ASC NULLS LAST, extra ASC NULLS LAST) AS rank_number FROM bid)
              WHERE rank_number <= 10"""
