"""Nexmark q15, bidding statistics report: per day, bids, bidders and auctions in three price ranges.

A running ``aggregate`` keyed by the day of ``date_time`` (``GROUP BY`` never drops a late bid, unlike a 1-day
event-time window) with ``count``, ``count_distinct`` and SQL's ``FILTER (WHERE ...)`` as the third element of an
aggregate; the upsert sink holds the latest row per day."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from pipeline import Job

SINK = "q15"
RANKS = {"rank1": "price < 10000", "rank2": "price >= 10000 AND price < 1000000", "rank3": "price >= 1000000"}


def rank_aggs() -> dict:
    """The twelve aggregates of q15 and q16: bids, bidders and auctions, in total and per price rank."""
    aggs: dict = {"total_bids": ("count", None)}
    aggs.update({f"{r}_bids": ("count", None, cond) for r, cond in RANKS.items()})
    aggs["total_bidders"] = ("count_distinct", "bidder")
    aggs.update({f"{r}_bidders": ("count_distinct", "bidder", cond) for r, cond in RANKS.items()})
    aggs["total_auctions"] = ("count_distinct", "auction")
    aggs.update({f"{r}_auctions": ("count_distinct", "auction", cond) for r, cond in RANKS.items()})
    return aggs


def job() -> Job:
    j = Job("nexmark_q15")
    (source(j, "bid").select("date_format(date_time, 'yyyy-MM-dd') AS day", "price", "bidder", "auction")
     .aggregate(uid="q15_per_day", key="day", aggs=rank_aggs())
     .sink(SINK, mode="upsert"))
    return j


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
