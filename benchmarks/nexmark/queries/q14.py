"""Nexmark q14, calculation: bids between 1M and 50M euros, labelled day/night time, with the number of 'c' in
``extra`` (Flink's ``count_char`` UDF as a Spark SQL expression)."""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from pipeline import Job

SINK = "q14"


def job() -> Job:
    j = Job("nexmark_q14")
    (source(j, "bid").filter("0.908 * price > 1000000 AND 0.908 * price < 50000000")
     .select("auction", "bidder", "0.908 * price AS price",
             "CASE WHEN hour(date_time) >= 8 AND hour(date_time) <= 18 THEN 'dayTime' "
             "WHEN hour(date_time) <= 6 OR hour(date_time) >= 20 THEN 'nightTime' "
             "ELSE 'otherTime' END AS bid_time_type",
             "date_time", "extra", "length(extra) - length(replace(extra, 'c', '')) AS c_counts")
     .sink(SINK))
    return j


def reference() -> str:
    return """SELECT auction, bidder, 0.908 * price AS price,
                     CASE WHEN hour(date_time) >= 8 AND hour(date_time) <= 18 THEN 'dayTime'
                          WHEN hour(date_time) <= 6 OR hour(date_time) >= 20 THEN 'nightTime'
                          ELSE 'otherTime' END AS bid_time_type,
                     date_time, extra,
                     CAST(length(extra) - length(replace(extra, 'c', '')) AS BIGINT) AS c_counts
              FROM bid WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000"""
