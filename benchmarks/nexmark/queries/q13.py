"""Nexmark q13, bounded side input join: each bid with the value of the side table ``side_input`` keyed by
``auction mod 10000`` (Flink: ``JOIN side_input FOR SYSTEM_TIME AS OF B.p_time ON mod(B.auction, 10000) =
S.key``). The side table is the immutable Parquet file the generator writes under the source root
(``side_input/side_input.parquet``); a lookup join (docs/operators.md "Lookup join") joins each epoch with the
version pinned when the epoch is first processed."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from pipeline import Job

SINK = "q13"


def job() -> Job:
    j = Job("nexmark_q13")
    (source(j, "bid").select("auction", "bidder", "price", "date_time", "auction % 10000 AS side_key")
     .lookup_join(uid="side_input", table="parquet:side_input", on=("side_key", "key"), columns=["value"])
     .select("auction", "bidder", "price", "date_time", "value")
     .sink(SINK))
    return j


def reference() -> str:
    return """SELECT b.auction, b.bidder, b.price, b.date_time, s.value
              FROM bid b JOIN side_input s ON b.auction % 10000 = s.key"""
