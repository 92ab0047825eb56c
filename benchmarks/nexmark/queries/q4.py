"""Nexmark q4, average price per category: the average of the winning (highest) bid of every auction, per
category. Not expressible yet (see ``MISSING``)."""
from __future__ import annotations

from benchmarks.nexmark.queries import NotExpressible
from pipeline import Job

SINK = "q4"
MISSING = "an aggregate over an updating stream (avg per category of each auction's running max bid)"


def job() -> Job:
    raise NotExpressible(MISSING)


def reference() -> str:
    # Flink SQL's meaning at the end of the input; AVG of a BIGINT is a BIGINT (truncated)
    return """WITH Q AS (SELECT max(B.price) AS final, A.category FROM auction A JOIN bid B ON A.id = B.auction
                         WHERE B.date_time BETWEEN A.date_time AND A.expires GROUP BY A.id, A.category)
              SELECT category AS id, CAST(trunc(avg(final)) AS BIGINT) AS final FROM Q GROUP BY category"""
