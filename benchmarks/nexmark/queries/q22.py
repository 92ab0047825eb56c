"""Nexmark q22, get URL directories: the first three directories of each bid's url (Flink's
``SPLIT_INDEX(url, '/', i)``, 0-based, as Spark's ``split(url, '/')[i]``)."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from pipeline import Job

SINK = "q22"


def job() -> Job:
    j = Job("nexmark_q22")
    source(j, "bid").select("auction", "bidder", "price", "channel", "split(url, '/')[3] AS dir1",
                            "split(url, '/')[4] AS dir2", "split(url, '/')[5] AS dir3").sink(SINK)
    return j


def reference() -> str:
    return """SELECT auction, bidder, price, channel, split_part(url, '/', 4) AS dir1,
                     split_part(url, '/', 5) AS dir2, split_part(url, '/', 6) AS dir3 FROM bid"""
