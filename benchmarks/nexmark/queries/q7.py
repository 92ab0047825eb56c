"""Nexmark q7, highest bid: the bids whose price is the highest of a 10-second tumbling window, within that
window's last 10 seconds (bid x the window's max price on ``price``; the window over all bids has one constant
key). Watermark: ``date_time`` - 4 s, as Nexmark's DDL."""
from __future__ import annotations

from benchmarks.nexmark.queries import WATERMARK_DELAY_SECONDS, source
from benchmarks.nexmark.reference import window_pairs
from pipeline import Job

SINK = "q7"


def job() -> Job:
    j = Job("nexmark_q7")
    bids = source(j, "bid")
    maxes = (bids.select("1 AS all_bids", "price", "date_time")
             .window(uid="q7_max_price", key="all_bids", event_time="date_time", size_seconds=10,
                     max_out_of_orderness_seconds=WATERMARK_DELAY_SECONDS, aggs={"maxprice": ("max", "price")})
             .select("maxprice AS price", "window_end AS max_date_time"))
    (bids.select("auction", "price", "bidder", "date_time", "extra")
     .join(maxes, on="price", uid="q7_bid_max")
     .filter("date_time BETWEEN max_date_time - INTERVAL 10 SECONDS AND max_date_time")
     .select("auction", "price", "bidder", "date_time", "extra").sink(SINK))
    return j


def reference() -> str:
    w = window_pairs("(SELECT 1 AS all_bids, price, date_time, _channel, _epoch FROM bid)", key="all_bids",
                     event_time="date_time", size=10, out_of_orderness=WATERMARK_DELAY_SECONDS)
    return f"""WITH M AS (SELECT max(price) AS maxprice, window_end FROM {w} GROUP BY window_start, window_end)
               SELECT B.auction, B.price, B.bidder, B.date_time, B.extra
               FROM bid B JOIN M ON B.price = M.maxprice
               WHERE B.date_time BETWEEN M.window_end - INTERVAL 10 SECOND AND M.window_end"""
