"""Nexmark q9, winning bids: each auction with its highest bid (earliest among equal prices) placed before it
expired. Not expressible yet (see ``MISSING``)."""
from __future__ import annotations

from benchmarks.nexmark.queries import NotExpressible
from pipeline import Job

SINK = "q9"
MISSING = "top-1 per key (ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC, date_time) <= 1)"


def job() -> Job:
    raise NotExpressible(MISSING)


def reference() -> str:
    return """SELECT * EXCLUDE (rn) FROM (
                SELECT A.id, A.item_name, A.description, A.initial_bid, A.reserve, A.date_time, A.expires, A.seller,
                       A.category, A.extra, B.auction, B.bidder, B.price, B.date_time AS bid_date_time,
                       B.extra AS bid_extra,
                       row_number() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.date_time ASC) AS rn
                FROM auction A JOIN bid B ON A.id = B.auction
                WHERE B.date_time BETWEEN A.date_time AND A.expires) WHERE rn = 1"""
