"""Nexmark q0, pass-through: every bid, unchanged (the cost of reading and writing)."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from pipeline import Job

SINK = "q0"


def job() -> Job:
    j = Job("nexmark_q0")
    source(j, "bid").select("auction", "bidder", "price", "date_time", "extra").sink(SINK)
    return j


def reference() -> str:
    return "SELECT auction, bidder, price, date_time, extra FROM bid"
