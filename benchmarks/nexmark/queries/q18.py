"""Nexmark q18, find last bid: each bidder's latest bid per auction. Not expressible yet (see ``MISSING``)."""
from __future__ import annotations

from benchmarks.nexmark.queries import NotExpressible
from pipeline import Job

SINK = "q18"
MISSING = ("keep-last deduplication per (bidder, auction) (ROW_NUMBER() ... ORDER BY date_time DESC = 1, an updating stream; deduplicate keeps the first row)")


def job() -> Job:
    raise NotExpressible(MISSING)


def reference() -> str:
    return """SELECT auction, bidder, price, channel, url, date_time, extra FROM (
                SELECT *, row_number() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC) AS rn FROM bid)
              WHERE rn = 1"""
