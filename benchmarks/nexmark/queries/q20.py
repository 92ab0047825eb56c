"""Nexmark q20, expand bid with auction: every bid of an auction in category 10 with the auction's columns
(bid x auction on ``auction = id``; auction ids are unique, declared with ``unique="right"``)."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from pipeline import Job

SINK = "q20"


def job() -> Job:
    j = Job("nexmark_q20")
    bids = source(j, "bid").select("auction", "bidder", "price", "channel", "url", "date_time AS bid_date_time",
                                   "extra AS bid_extra")
    auctions = source(j, "auction").filter("category = 10").select(
        "id AS auction", "item_name", "description", "initial_bid", "reserve", "date_time AS auction_date_time",
        "expires", "seller", "category", "extra AS auction_extra")
    (bids.join(auctions, on="auction", uid="q20_bid_auction", unique="right")
     .select("auction", "bidder", "price", "channel", "url", "bid_date_time", "bid_extra", "item_name",
             "description", "initial_bid", "reserve", "auction_date_time", "expires", "seller", "category",
             "auction_extra")
     .sink(SINK))
    return j


def reference() -> str:
    return """SELECT B.auction, B.bidder, B.price, B.channel, B.url, B.date_time AS bid_date_time,
                     B.extra AS bid_extra, A.item_name, A.description, A.initial_bid, A.reserve,
                     A.date_time AS auction_date_time, A.expires, A.seller, A.category, A.extra AS auction_extra
              FROM bid B JOIN auction A ON B.auction = A.id
              WHERE A.category = 10 AND ttl_ok(B._ingest_ts, B._epoch, A._ingest_ts, A._epoch)"""
