"""Nexmark q15, bidding statistics report: per day, bids, bidders and auctions in three price ranges.
Not expressible yet (see ``MISSING``)."""
from __future__ import annotations

from benchmarks.nexmark.queries import NotExpressible
from pipeline import Job

SINK = "q15"
MISSING = ("count_distinct and filtered aggregates (FILTER (WHERE ...)) in aggregate"
           "; a 1-day event-time window has count_distinct and avg but dead-letters late records, "
           "which GROUP BY day never drops")


def job() -> Job:
    raise NotExpressible(MISSING)


def reference() -> str:
    return """SELECT strftime(date_time, '%Y-%m-%d') AS day,
                     count(*) AS total_bids,
                     count(*) FILTER (WHERE price < 10000) AS rank1_bids,
                     count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
                     count(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
                     count(DISTINCT bidder) AS total_bidders,
                     count(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders,
                     count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders,
                     count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders,
                     count(DISTINCT auction) AS total_auctions,
                     count(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions,
                     count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions,
                     count(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions
              FROM bid GROUP BY strftime(date_time, '%Y-%m-%d')"""
