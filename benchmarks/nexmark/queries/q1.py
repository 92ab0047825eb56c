"""Nexmark q1, currency conversion: bid prices from dollars to euros (``0.908 * price``, a decimal)."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from pipeline import Job

SINK = "q1"


def job() -> Job:
    j = Job("nexmark_q1")
    source(j, "bid").select("auction", "bidder", "0.908 * price AS price", "date_time", "extra").sink(SINK)
    return j


def reference() -> str:
    return "SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid"
