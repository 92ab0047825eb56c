"""Nexmark q3, local item suggestion: sellers in OR, ID or CA of auctions in category 10 (auction x person on
``seller = id``). Person ids are unique, declared with ``unique="right"``: a matched auction leaves state."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from pipeline import Job

SINK = "q3"


def job() -> Job:
    j = Job("nexmark_q3")
    auctions = source(j, "auction").filter("category = 10").select("id", "seller")
    persons = source(j, "person").filter("state IN ('OR', 'ID', 'CA')").select(
        "id AS seller", "name", "city", "state")
    (auctions.join(persons, on="seller", uid="q3_auction_seller", unique="right")
     .select("name", "city", "state", "id").sink(SINK))
    return j


def reference() -> str:
    return """SELECT P.name, P.city, P.state, A.id
              FROM auction A JOIN person P ON A.seller = P.id
              WHERE A.category = 10 AND P.state IN ('OR', 'ID', 'CA')
                AND ttl_ok(A._ingest_ts, A._epoch, P._ingest_ts, P._epoch)"""
