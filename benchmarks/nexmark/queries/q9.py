"""Nexmark q9, winning bids: each auction with its highest bid (earliest among equal prices) placed before it
expired.

The auction x bid join on ``id = auction`` (auction ids are unique: ``unique="left"``, a matched bid leaves state),
the time filter ``bid_date_time BETWEEN date_time AND expires``, then ``top_n`` per auction with ``n=1`` ordered by
``price DESC, bid_date_time``: an updating stream, one row per auction, in an upsert sink keyed by ``id``. The
engine breaks the remaining ties by the pair's ``_ingest_ts`` (the later of its two rows', later first), then the
other columns (docs/operators.md "Top-N and keep-last"); the reference spells that order out."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from pipeline import Job

SINK = "q9"
COLUMNS = ("id", "item_name", "description", "initial_bid", "reserve", "date_time", "expires", "seller", "category",
           "extra", "auction", "bidder", "price", "bid_date_time", "bid_extra")


def job() -> Job:
    j = Job("nexmark_q9")
    auctions = source(j, "auction").select("id", "item_name", "description", "initial_bid", "reserve", "date_time",
                                           "expires", "seller", "category", "extra")
    bids = source(j, "bid").select("auction AS id", "auction", "bidder", "price", "date_time AS bid_date_time",
                                   "extra AS bid_extra")
    (auctions.join(bids, on="id", uid="q9_auction_bid", unique="left")
     .filter("bid_date_time BETWEEN date_time AND expires")
     .top_n(uid="q9_winning_bid", key="id", order_by=["price DESC", "bid_date_time"], n=1, rank_column=None)
     .select(*COLUMNS)
     .sink(SINK, mode="upsert", key=["id"]))
    return j


def reference() -> str:
    return """SELECT * EXCLUDE (rn) FROM (
                SELECT A.id, A.item_name, A.description, A.initial_bid, A.reserve, A.date_time, A.expires, A.seller,
                       A.category, A.extra, B.auction, B.bidder, B.price, B.date_time AS bid_date_time,
                       B.extra AS bid_extra,
                       row_number() OVER (PARTITION BY A.id ORDER BY B.price DESC NULLS LAST,
                         B.date_time ASC NULLS LAST, greatest(A._ingest_ts, B._ingest_ts) DESC,
                         B.bidder ASC NULLS LAST, B.extra ASC NULLS LAST) AS rn
                FROM auction A JOIN bid B ON A.id = B.auction
                WHERE B.date_time BETWEEN A.date_time AND A.expires
                  AND ttl_ok(A._ingest_ts, A._epoch, B._ingest_ts, B._epoch)) WHERE rn = 1"""
