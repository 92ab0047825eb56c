"""Nexmark q6, average selling price by seller: per seller, the average of the winning bids of its last 10
auctions. Not expressible yet (see ``MISSING``)."""
from __future__ import annotations

from benchmarks.nexmark.queries import NotExpressible
from pipeline import Job

SINK = "q6"
MISSING = ("an over aggregate over an updating stream: Stream.over_aggregate exists for append streams and refuses "
           "top-1 per auction's updating stream, whose changed winner must retract its own output and the outputs "
           "of the up to 10 following winners of its seller (Flink's OVER aggregate rejects update changes too)")


def job() -> Job:
    raise NotExpressible(MISSING)


def reference() -> str:
    # the final rows of Flink's meaning: each auction's winning bid, then per seller the average of the
    # current and up to 10 preceding winners ordered by bid time (ties broken by auction id)
    return """WITH W AS (SELECT A.id, A.seller, B.price, B.date_time,
                               row_number() OVER (PARTITION BY A.id, A.seller ORDER BY B.price DESC) AS rn
                         FROM auction A JOIN bid B ON A.id = B.auction
                         WHERE B.date_time BETWEEN A.date_time AND A.expires)
              SELECT seller, CAST(trunc(avg(price) OVER (PARTITION BY seller ORDER BY date_time, id
                                  ROWS BETWEEN 10 PRECEDING AND CURRENT ROW)) AS BIGINT) AS avg_price
              FROM W WHERE rn = 1"""
