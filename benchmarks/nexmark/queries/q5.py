"""Nexmark q5, hot items: the auctions with the most bids in each 10-second window sliding by 2 seconds. Not
expressible yet (see ``MISSING``)."""
from __future__ import annotations

from benchmarks.nexmark.queries import WATERMARK_DELAY_SECONDS, NotExpressible
from benchmarks.nexmark.reference import window_pairs
from pipeline import Job

SINK = "q5"
MISSING = ("a join with an updating stream: the per-window maximum (GROUP BY starttime, endtime over the window "
           "output) is a running aggregate whose rising maximum takes back pairs the join emitted; updating "
           "streams reach aggregates only, and sinks cannot delete rows yet")


def job() -> Job:
    raise NotExpressible(MISSING)


def reference() -> str:
    w = window_pairs("(SELECT auction, date_time, _channel, _epoch FROM bid)", key="auction", event_time="date_time",
                     size=10, slide=2, out_of_orderness=WATERMARK_DELAY_SECONDS)
    return f"""WITH C AS (SELECT auction, count(*) AS num, window_start, window_end FROM {w}
                          GROUP BY auction, window_start, window_end),
                    M AS (SELECT max(num) AS maxn, window_start, window_end FROM C GROUP BY window_start, window_end)
               SELECT C.auction, C.num FROM C JOIN M ON C.window_start = M.window_start
                 AND C.window_end = M.window_end AND C.num >= M.maxn"""
