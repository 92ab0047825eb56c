"""Nexmark q2, selection: the bids of every 123rd auction."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from pipeline import Job

SINK = "q2"


def job() -> Job:
    j = Job("nexmark_q2")
    source(j, "bid").filter("auction % 123 = 0").select("auction", "price").sink(SINK)
    return j


def reference() -> str:
    return "SELECT auction, price FROM bid WHERE auction % 123 = 0"
