"""Nexmark q16, channel statistics report: per channel and day, bids, bidders and auctions in three price ranges.

A running ``aggregate`` with ``count``, ``count_distinct`` and ``FILTER (WHERE ...)`` (see q15). ``aggregate``
takes one key column, so the query groups by one computed column holding (channel, day) as JSON and splits it
again after the aggregate; the upsert sink is keyed by (channel, day)."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from benchmarks.nexmark.queries.q15 import rank_aggs
from pipeline import Job

SINK = "q16"


def job() -> Job:
    j = Job("nexmark_q16")
    aggs = {"minute": ("max", "minute"), **rank_aggs()}
    (source(j, "bid")
     .select("to_json(named_struct('channel', channel, 'day', date_format(date_time, 'yyyy-MM-dd'))) AS channel_day",
             "date_format(date_time, 'HH:mm') AS minute", "price", "bidder", "auction")
     .aggregate(uid="q16_per_channel_day", key="channel_day", aggs=aggs)
     .select("get_json_object(channel_day, '$.channel') AS channel", "get_json_object(channel_day, '$.day') AS day",
             *aggs)
     .sink(SINK, mode="upsert", key=["channel", "day"]))
    return j


def reference() -> str:
    return """SELECT channel, strftime(date_time, '%Y-%m-%d') AS day, max(strftime(date_time, '%H:%M')) AS minute,
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
              FROM bid GROUP BY channel, strftime(date_time, '%Y-%m-%d')"""
