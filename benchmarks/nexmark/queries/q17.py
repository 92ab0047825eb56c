"""Nexmark q17, auction statistics report: per auction and day, bids in three price ranges and min/max/avg/sum price.

A running ``aggregate`` with ``count``, ``FILTER (WHERE ...)``, ``min``, ``max``, ``avg`` and ``sum``; one
computed key column holds (auction, day) and is split again after the aggregate (see q16). Flink's ``avg`` of a
BIGINT is a BIGINT (truncated): the query casts the average, as the SQL text's result type has it."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from benchmarks.nexmark.queries.q15 import RANKS
from pipeline import Job

SINK = "q17"


def job() -> Job:
    j = Job("nexmark_q17")
    aggs: dict = {"total_bids": ("count", None)}
    aggs.update({f"{r}_bids": ("count", None, cond) for r, cond in RANKS.items()})
    aggs.update({"min_price": ("min", "price"), "max_price": ("max", "price"), "avg_price": ("avg", "price"),
                 "sum_price": ("sum", "price")})
    (source(j, "bid")
     .select("to_json(named_struct('auction', auction, 'day', date_format(date_time, 'yyyy-MM-dd'))) AS auction_day",
             "price")
     .aggregate(uid="q17_per_auction_day", key="auction_day", aggs=aggs)
     .select("CAST(get_json_object(auction_day, '$.auction') AS BIGINT) AS auction",
             "get_json_object(auction_day, '$.day') AS day", "total_bids", "rank1_bids", "rank2_bids", "rank3_bids",
             "min_price", "max_price", "CAST(avg_price AS BIGINT) AS avg_price", "sum_price")
     .sink(SINK, mode="upsert", key=["auction", "day"]))
    return j


def reference() -> str:
    return """SELECT auction, strftime(date_time, '%Y-%m-%d') AS day, count(*) AS total_bids,
                     count(*) FILTER (WHERE price < 10000) AS rank1_bids,
                     count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
                     count(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
                     min(price) AS min_price, max(price) AS max_price,
                     CAST(trunc(avg(price)) AS BIGINT) AS avg_price, sum(price) AS sum_price
              FROM bid GROUP BY auction, strftime(date_time, '%Y-%m-%d')"""
