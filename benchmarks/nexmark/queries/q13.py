"""Nexmark q13, bounded side input join: each bid with the value of a side table keyed by ``auction mod
10000``. Not expressible yet (see ``MISSING``)."""
from __future__ import annotations

from benchmarks.nexmark.queries import NotExpressible
from pipeline import Job

SINK = "q13"
MISSING = "a join with a bounded side table (FOR SYSTEM_TIME AS OF a Parquet/Delta/Iceberg table)"


def job() -> Job:
    raise NotExpressible(MISSING)


def reference() -> str:
    # Nexmark's side input: key k in [0, 10000) with value = k as a string
    return """SELECT auction, bidder, price, date_time, CAST(auction % 10000 AS VARCHAR) AS value FROM bid"""
