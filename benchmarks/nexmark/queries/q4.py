"""Nexmark q4, average price per category: the average of the winning (highest) bid of every auction, per
category.

The auction x bid join on ``id = auction`` (auction ids are unique: ``unique="left"``), the time filter
``bid_date_time BETWEEN date_time AND expires``, the highest bid per auction (a running aggregate keyed by the
auction id; its category, fixed per auction, is carried as ``max(category)``: SQL's ``GROUP BY A.id, A.category``),
then the average per category over that **updating stream** (docs/operators.md "Updating streams": each auction's
new maximum retracts its previous one). Flink's ``AVG`` of a ``BIGINT`` is a ``BIGINT`` (the sink's ``final
BIGINT``), so the average is truncated toward zero: ``CAST(avg AS BIGINT)``. An upsert sink keyed by ``id``."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from pipeline import Job

SINK = "q4"


def job() -> Job:
    j = Job("nexmark_q4")
    auctions = source(j, "auction").select("id", "category", "date_time", "expires")
    bids = source(j, "bid").select("auction AS id", "price", "date_time AS bid_date_time")
    winning = (auctions.join(bids, on="id", uid="q4_auction_bid", unique="left")
               .filter("bid_date_time BETWEEN date_time AND expires")
               .aggregate(uid="q4_winning_bid", key="id", aggs={"final": ("max", "price"),
                                                                "category": ("max", "category")}))
    (winning.aggregate(uid="q4_avg_per_category", key="category", aggs={"final": ("avg", "final")})
     .select("category AS id", "CAST(final AS BIGINT) AS final")
     .sink(SINK, mode="upsert", key=["id"]))
    return j


def reference() -> str:
    return """WITH Q AS (SELECT max(B.price) AS final, A.category FROM auction A JOIN bid B ON A.id = B.auction
                         WHERE B.date_time BETWEEN A.date_time AND A.expires
                           AND ttl_ok(A._ingest_ts, A._epoch, B._ingest_ts, B._epoch)
                         GROUP BY A.id, A.category)
              SELECT category AS id, CAST(trunc(avg(final)) AS BIGINT) AS final FROM Q GROUP BY category"""
