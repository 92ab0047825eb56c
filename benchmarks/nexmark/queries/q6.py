"""Nexmark q6, average selling price by seller: per seller, the average of the winning bids of its last 10
auctions (nexmark/nexmark's q6.sql: ``AVG(Q.price) OVER (PARTITION BY Q.seller ORDER BY Q.dateTime ROWS BETWEEN 10
PRECEDING AND CURRENT ROW)`` over the top-1 bid per auction; Flink SQL cannot run it: its OVER window does not
consume retractions).

The auction x bid join on ``id = auction`` (``unique="left"``), the time filter ``bid_date_time BETWEEN date_time
AND expires``, ``top_n`` per auction with ``n=1`` ordered by ``price DESC`` (an updating stream: a higher bid
replaces the auction's winner; the engine breaks equal prices by the pair's ``_ingest_ts``, later first, then the
other columns), then the over aggregate per seller over that updating stream (docs/operators.md "Over aggregate":
each new winner retracts its auction's previous one, which changes its own output and the outputs of the up to 10
following winners of the seller). Ties in the over order: ``bid_date_time``, then the auction id. Flink's ``AVG``
of a ``BIGINT`` is a ``BIGINT``: ``CAST(avg AS BIGINT)`` truncates. The output is an updating stream with one row
per auction (its seller and average): an upsert sink keyed by ``id``."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from pipeline import Job

SINK = "q6"


def job() -> Job:
    j = Job("nexmark_q6")
    auctions = source(j, "auction").select("id", "seller", "date_time", "expires")
    bids = source(j, "bid").select("auction AS id", "price", "date_time AS bid_date_time")
    winners = (auctions.join(bids, on="id", uid="q6_auction_bid", unique="left")
               .filter("bid_date_time BETWEEN date_time AND expires")
               .top_n(uid="q6_winning_bid", key="id", order_by="price DESC", n=1, rank_column=None)
               .select("id", "seller", "price", "bid_date_time"))
    (winners.over_aggregate(uid="q6_avg_per_seller", key="seller", event_time="bid_date_time", rows_preceding=10,
                            aggs={"avg_price": ("avg", "price")})
     .select("id", "seller", "CAST(avg_price AS BIGINT) AS avg_price")
     .sink(SINK, mode="upsert", key=["id"]))
    return j


def reference() -> str:
    # each auction's winning bid (top_n's order spelled out: price, the pair's later _ingest_ts, the other columns),
    # then per seller the average of the current and up to 10 preceding winners by bid time, ties by auction id
    return """WITH P AS (SELECT A.id, A.seller, A.date_time, A.expires, B.price, B.date_time AS bid_date_time,
                               greatest(A._ingest_ts, B._ingest_ts) AS ingest
                         FROM auction A JOIN bid B ON A.id = B.auction
                         WHERE B.date_time BETWEEN A.date_time AND A.expires
                           AND ttl_ok(A._ingest_ts, A._epoch, B._ingest_ts, B._epoch)),
              W AS (SELECT *, row_number() OVER (PARTITION BY id ORDER BY price DESC NULLS LAST, ingest DESC,
                                                 seller ASC NULLS LAST, date_time ASC NULLS LAST,
                                                 expires ASC NULLS LAST, bid_date_time ASC NULLS LAST) AS rn
                    FROM P)
              SELECT id, seller, CAST(trunc(avg(price) OVER (PARTITION BY seller ORDER BY bid_date_time, id, price
                                  ROWS BETWEEN 10 PRECEDING AND CURRENT ROW)) AS BIGINT) AS avg_price
              FROM W WHERE rn = 1"""
