"""Nexmark q17, auction statistics report: per auction and day, bids in three price ranges and min/max/avg/sum price.
Not expressible yet (see ``MISSING``)."""
from __future__ import annotations

from benchmarks.nexmark.queries import NotExpressible
from pipeline import Job

SINK = "q17"
MISSING = ("avg and filtered aggregates (FILTER (WHERE ...)) in aggregate, and an aggregate key of several "
           "columns (auction, day)"
           "; a 1-day event-time window has count_distinct and avg but dead-letters late records, "
           "which GROUP BY day never drops")


def job() -> Job:
    raise NotExpressible(MISSING)


def reference() -> str:
    return """SELECT auction, strftime(date_time, '%Y-%m-%d') AS day, count(*) AS total_bids,
                     count(*) FILTER (WHERE price < 10000) AS rank1_bids,
                     count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
                     count(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
                     min(price) AS min_price, max(price) AS max_price,
                     CAST(trunc(avg(price)) AS BIGINT) AS avg_price, sum(price) AS sum_price
              FROM bid GROUP BY auction, strftime(date_time, '%Y-%m-%d')"""
