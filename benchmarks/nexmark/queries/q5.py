"""Nexmark q5, hot items: the auctions with the most bids in each 10-second window sliding by 2 seconds.

As written in Flink SQL: the bid count per auction and hop window (``AuctionBids``, an append stream: each window
fires once, docs/windows.md), the maximum count per window (``MaxBids``: a running aggregate over those counts, an
**updating stream**), and their join on the window with ``num >= maxn``: a **retracting join** (docs/operators.md
"Updating streams") - when a window's maximum rises, the pairs it emitted with the old maximum are taken back, and
a pair the filter then drops is deleted from the upsert sink. One window is its ``window_start`` (all windows are 10
s long, so ``window_end`` follows). The sink is keyed by ``(auction, starttime)``, which it therefore shows besides
Flink's ``auction, num``."""
from __future__ import annotations

from benchmarks.nexmark.queries import WATERMARK_DELAY_SECONDS, source
from benchmarks.nexmark.reference import window_pairs
from pipeline import Job

SINK = "q5"


def job() -> Job:
    j = Job("nexmark_q5")
    counts = (source(j, "bid").select("auction", "date_time")
              .window(uid="q5_auction_bids", key="auction", event_time="date_time", size_seconds=10, slide_seconds=2,
                      max_out_of_orderness_seconds=WATERMARK_DELAY_SECONDS, aggs={"num": ("count", None)})
              .select("auction", "num", "window_start AS starttime", "window_end AS endtime"))
    max_bids = (counts.aggregate(uid="q5_max_bids", key="starttime", aggs={"maxn": ("max", "num")})
                .select("starttime", "maxn"))
    (counts.join(max_bids, on="starttime", uid="q5_hot_join")
     .filter("num >= maxn")
     .select("auction", "num", "starttime")
     .sink(SINK, mode="upsert", key=["auction", "starttime"]))
    return j


def reference() -> str:
    w = window_pairs("(SELECT auction, date_time, _channel, _epoch FROM bid)", key="auction", event_time="date_time",
                     size=10, slide=2, out_of_orderness=WATERMARK_DELAY_SECONDS)
    return f"""WITH C AS (SELECT auction, count(*) AS num, window_start, window_end FROM {w}
                          GROUP BY auction, window_start, window_end),
                    M AS (SELECT max(num) AS maxn, window_start, window_end FROM C GROUP BY window_start, window_end)
               SELECT C.auction, C.num, C.window_start AS starttime FROM C JOIN M ON C.window_start = M.window_start
                 AND C.window_end = M.window_end AND C.num >= M.maxn"""
