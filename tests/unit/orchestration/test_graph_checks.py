"""The consistency checks that follow from a job's graph (``pipeline.orchestration.quality._graph_checks``) hold for
any job, not only the demo: a job of this test's own, with other table and column names."""
from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline import Job
from pipeline.orchestration.quality import _graph_checks

pytestmark = [pytest.mark.unit]

TS = pa.timestamp("us", tz="UTC")
VISITS = pa.schema([("visit_id", pa.string()), ("shop", pa.string()), ("_ingest_ts", TS)])
SALES = pa.schema([("visit_id", pa.string()), ("euros", pa.float64()), ("_ingest_ts", TS)])


def _job(filter_before_agg: bool = False) -> Job:
    job = Job("shops")
    visits = job.source("visits", VISITS, key="visit_id")
    sales = job.source("sales", SALES, key="visit_id")
    bought = visits.join(sales, on="visit_id", uid="bought", unique="both",
                         output=("visit_id", "shop", "euros", "_ingest_ts"))
    bought.sink("purchases")
    agg_in = bought.filter("euros > 0") if filter_before_agg else bought
    agg_in.aggregate(uid="per_shop", key="shop",
                     aggs={"n": ("count", None), "total": ("sum", "euros"), "top": ("max", "euros")}
                     ).sink("shop_totals", mode="upsert")
    return job


PURCHASES = pa.table({"visit_id": ["v1", "v2", "v3"], "shop": ["a", "a", "b"], "euros": [1.5, 2.25, 10.0]})


def test_consistent_tables_pass_and_say_what_was_checked():
    totals = pa.table({"shop": ["a", "b"], "n": [2, 1], "total": [3.75, 10.0], "top": [2.25, 10.0]})
    problems, checks = _graph_checks(_job(), {"purchases": PURCHASES, "shop_totals": totals})
    assert problems == []
    assert checks == ["purchases: visit_id unique (join bought, unique=both)",
                      "shop_totals agrees with purchases (aggregate per_shop)"]


def test_a_duplicate_key_and_a_wrong_total_are_named():
    dup = pa.concat_tables([PURCHASES, PURCHASES.slice(0, 1)])
    totals = pa.table({"shop": ["a", "b"], "n": [3, 1], "total": [5.25, 99.0], "top": [2.25, 10.0]})
    problems, _ = _graph_checks(_job(), {"purchases": dup, "shop_totals": totals})
    assert len(problems) == 2
    assert problems[0].startswith("table purchases: 1 visit_id values committed more than once (join bought")
    assert "table shop_totals disagrees with purchases (aggregate per_shop recomputed from it) for 1 keys, e.g. " \
           "b: expected (1, 10.0, 10.0) got (1, 99.0, 10.0)" in problems[1]


def test_an_aggregate_over_a_filtered_stream_is_not_compared():
    totals = pa.table({"shop": ["a"], "n": [7], "total": [1.0], "top": [1.0]})
    problems, checks = _graph_checks(_job(filter_before_agg=True), {"purchases": PURCHASES, "shop_totals": totals})
    assert problems == [] and checks == ["purchases: visit_id unique (join bought, unique=both)"]
