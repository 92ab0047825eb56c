"""Nexmark q19, auction top-10 price: the 10 highest bids of each auction. Not expressible yet (see ``MISSING``)."""
from __future__ import annotations

from benchmarks.nexmark.queries import NotExpressible
from pipeline import Job

SINK = "q19"
MISSING = ("top-N per key (ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) <= 10, an updating stream)")


def job() -> Job:
    raise NotExpressible(MISSING)


def reference() -> str:
    return """SELECT auction, bidder, price, channel, url, date_time, extra, rank_number FROM (
                SELECT *, row_number() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number FROM bid)
              WHERE rank_number <= 10"""
