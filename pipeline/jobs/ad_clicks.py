"""The second example job ``ad_clicks``: deduplicated clicks attributed to impressions, per-campaign
click and impression counts per 5-minute event-time window (click-through rate = clicks / impressions).

Built only from the public job API (nothing in the runtime knows this job)::

    impressions ──────────────────────────────┬─ window(campaign_id, 5 min) ─> sink campaign_impressions
         └─ select(view_key = user|ad, ...) ──┴─ join(view_key, many-to-many) ─┐
    clicks ─ deduplicate(click_dedup) ─ select(view_key, ...) ──────────────────┘
                                    window(campaign_id, 5 min, on click_time) ─> sink campaign_clicks

* ``click_dedup``: clients re-send clicks (same ``click_id``, later ``_ingest_ts``, any partition); the first
  copy passes, later copies within an hour are dropped (``Stream.deduplicate``). The same logic as a
  user-defined keyed operator, :func:`first_occurrence` with ``Stream.process``, is the example of
  docs/process.md.
* ``click_attribution``: a user may see the same ad several times and click it several times, so the join on
  ``view_key`` is many-to-many: every (impression, click) pair of the same user and ad.
* ``campaign_clicks``: per campaign and 5-minute window of click time: distinct clicks, distinct clicked
  impressions and attribution pairs. ``campaign_impressions``: per campaign and window of impression time:
  impressions and distinct users. Both: watermark = max event time - 30 s, allowed lateness 60 s,
  ``emit="final"``; later records are dead letters (docs/windows.md).

Generator: ``python -m pipeline.demo.ad_generate``; independent oracle: ``python -m pipeline.demo.ad_oracle``.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import Job

__all__ = ["IMPRESSIONS_SCHEMA", "CLICKS_SCHEMA", "build_job", "first_occurrence", "WINDOW_SECONDS",
           "OUT_OF_ORDERNESS_SECONDS", "ALLOWED_LATENESS_SECONDS", "DEDUP_TTL_SECONDS"]

TS = pa.timestamp("us", tz="UTC")
IMPRESSIONS_SCHEMA = pa.schema([("impression_id", pa.string()), ("ad_id", pa.string()), ("campaign_id", pa.string()),
                                ("user_id", pa.string()), ("event_time", TS), ("_ingest_ts", TS)])
CLICKS_SCHEMA = pa.schema([("click_id", pa.string()), ("ad_id", pa.string()), ("user_id", pa.string()),
                           ("event_time", TS), ("_ingest_ts", TS)])
WINDOW_SECONDS = 300
OUT_OF_ORDERNESS_SECONDS = 30
ALLOWED_LATENESS_SECONDS = 60
DEDUP_TTL_SECONDS = 3600
SEEN_SCHEMA = pa.schema([("click_id", pa.string())])


def first_occurrence(rows: pa.Table, state: pa.Table) -> tuple[pa.Table, pa.Table]:
    """``process`` function of ``click_dedup``: rows come sorted by (click_id, _ingest_ts, ...); pass the first
    row of every click id not seen before; remember every click id of this call."""
    fresh = rows.filter(pc.invert(pc.is_in(rows["click_id"], value_set=state["click_id"])))
    idx = fresh.append_column("_i", pa.array(range(fresh.num_rows), pa.int64())).group_by(
        "click_id", use_threads=False).aggregate([("_i", "min")])["_i_min"]
    return pa.table({"click_id": pc.unique(rows["click_id"])}), fresh.take(idx)


def build_job() -> Job:
    job = Job("ad_clicks", max_parallelism=64)
    impressions = job.source("impressions", IMPRESSIONS_SCHEMA, key="impression_id")
    clicks = job.source("clicks", CLICKS_SCHEMA, key="click_id")
    unique_clicks = clicks.deduplicate(uid="click_dedup", key="click_id", ttl_seconds=DEDUP_TTL_SECONDS)
    views = impressions.select("concat(user_id, '|', ad_id) AS view_key", "impression_id", "campaign_id")
    clicked = unique_clicks.select("concat(user_id, '|', ad_id) AS view_key", "click_id", "event_time AS click_time")
    pairs = views.join(clicked, on="view_key", uid="click_attribution")
    pairs.window(uid="campaign_clicks", key="campaign_id", event_time="click_time",
                 aggs={"clicks": ("count_distinct", "click_id"),
                       "clicked_impressions": ("count_distinct", "impression_id"),
                       "attributions": ("count", None)}, size_seconds=WINDOW_SECONDS,
                 max_out_of_orderness_seconds=OUT_OF_ORDERNESS_SECONDS,
                 allowed_lateness_seconds=ALLOWED_LATENESS_SECONDS, emit="final").sink("campaign_clicks")
    impressions.window(uid="campaign_impressions", key="campaign_id", event_time="event_time",
                       aggs={"impressions": ("count", None), "users": ("count_distinct", "user_id")},
                       size_seconds=WINDOW_SECONDS, max_out_of_orderness_seconds=OUT_OF_ORDERNESS_SECONDS,
                       allowed_lateness_seconds=ALLOWED_LATENESS_SECONDS, emit="final").sink("campaign_impressions")
    return job
