"""Nexmark q21, add channel id: the channel id of hot channels by name, of the others from the url's
``channel_id=`` parameter; bids with neither are dropped. (Spark's ``regexp_extract`` returns '' where Flink's
``REGEXP_EXTRACT`` returns NULL, so "no match" is written ``= ''``.)"""
from __future__ import annotations

from benchmarks.nexmark.queries import source
from pipeline import Job

SINK = "q21"
_ID = "regexp_extract(url, '(&|^)channel_id=([^&]*)', 2)"


def job() -> Job:
    j = Job("nexmark_q21")
    (source(j, "bid")
     .filter(f"{_ID} <> '' OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')")
     .select("auction", "bidder", "price", "channel",
             "CASE WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google' THEN '1' "
             "WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) = 'baidu' THEN '3' "
             f"ELSE {_ID} END AS channel_id")
     .sink(SINK))
    return j


def reference() -> str:
    # Flink: REGEXP_EXTRACT is NULL when the pattern does not match
    rx = "nullif(regexp_extract(url, '(&|^)channel_id=([^&]*)', 2), '')"
    return f"""SELECT auction, bidder, price, channel,
                      CASE WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google' THEN '1'
                           WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) = 'baidu' THEN '3'
                           ELSE {rx} END AS channel_id
               FROM bid WHERE {rx} IS NOT NULL OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')"""
