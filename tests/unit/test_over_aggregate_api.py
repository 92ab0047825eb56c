"""``Stream.over_aggregate``: what the job graph refuses when it is built (before any side effect), each error naming
the operator (an updating input names the node it comes from); and the runtime check (aligned exactly-once
checkpoints, append sinks)."""
from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest

from pipeline import Job
from pipeline.barriers.events import CheckpointingMode
from pipeline.batch.bootstrap.plan import refusal
from pipeline.exceptions import ConfigError
from pipeline.job import OverAggregateNode
from pipeline.runtime.operators.over_aggregate import check_over
from pipeline.updating_streams import (
    deleting_producers,
    emits_changelog,
    sink_deletes,
    unsupported_reason,
    writer_reads_changelog,
)

pytestmark = pytest.mark.unit

TS = pa.timestamp("us", tz="UTC")
A = pa.schema([("k", pa.string()), ("t", TS), ("x", pa.int64()), ("_ingest_ts", TS)])
AGGS = {"avg_x": ("avg", "x"), "n": ("count", None)}


def _one():
    job = Job("j")
    return job, job.source("a", A, key="k")


def test_node_and_state_names():
    job, a = _one()
    a.over_aggregate(uid="ov", key="k", event_time="t", rows_preceding=3, aggs=AGGS).sink("o")
    op = job.operator("ov")
    assert isinstance(op, OverAggregateNode) and op.rows == 3 and op.range_seconds is None
    assert op.aggs == (("avg_x", "avg", "x"), ("n", "count", None)) and job.state_names("ov") == ("rows", "wm")


@pytest.mark.parametrize("kw, message", [
    (dict(rows_preceding=3, range_preceding_seconds=5), "give exactly one of rows_preceding"),
    (dict(), "give exactly one of rows_preceding"),
    (dict(rows_preceding=-1), "rows_preceding must be a non-negative whole number"),
    (dict(range_preceding_seconds=1.5), "range_preceding_seconds must be a non-negative whole number"),
    (dict(rows_preceding=1, event_time="x"), "event_time 'x' must be a timestamp"),
    (dict(rows_preceding=1, key="nope"), "the input lacks columns \\['nope'\\]"),
    (dict(rows_preceding=1, aggs={"x": ("sum", "x")}), "aggregate names \\['x'\\] are input columns"),
    (dict(rows_preceding=1, aggs={"d": ("count_distinct", "x")}), "unknown function 'count_distinct'"),
    (dict(rows_preceding=1, aggs={"f": ("count", None, "x > 1")}), "filtered aggregates"),
])
def test_refused_when_built(kw, message):
    job, a = _one()
    args = {**dict(uid="ov", key="k", event_time="t", aggs=AGGS), **kw}
    with pytest.raises(ConfigError, match=message) as e:
        a.over_aggregate(**args)
    assert "over_aggregate 'ov'" in str(e.value)


def test_updating_input():
    """Over a top-N's or a running aggregate's updating stream: accepted (a retract changelog, sinks upsert); over
    a window's update stream (no retractions): refused naming the window; an aggregate over an updating over
    aggregate: refused naming it."""
    job, a = _one()
    top = a.top_n(uid="best", key="x", order_by="t DESC", n=1, rank_column=None)
    top.filter("x > 0").over_aggregate(uid="ov", key="k", event_time="t", rows_preceding=1, aggs=AGGS).sink(
        "o", mode="upsert", key=["x"])
    assert job.operator("ov").updating
    ok = SimpleNamespace(checkpoint_mode=CheckpointingMode.EXACTLY_ONCE, unaligned=False, aligned_timeout_seconds=None)
    check_over(job, job.operator("ov"), ok)
    # it emits a retract changelog; its upsert sink is written by a sink writer and deletes (vanished rows)
    ov = job.node_id(job.operator("ov"))
    sink = job.sinks()[0]
    assert job.operator_sink(ov) is None and ov in deleting_producers(job) and emits_changelog(job, ov)
    assert sink_deletes(job, sink) and writer_reads_changelog(job, sink)
    job1, a1 = _one()   # a delete carries the key only: a sink partitioned outside its key is refused
    a1.top_n(uid="best", key="x", order_by="t DESC", n=1, rank_column=None).over_aggregate(
        uid="ov", key="k", event_time="t", rows_preceding=1, aggs=AGGS).sink("o", mode="upsert", key=["x"],
                                                                              partition_by=["k"])
    with pytest.raises(ConfigError, match="sink 'o' deletes rows .* partitioned by \\['k'\\]"):
        check_over(job1, job1.operator("ov"), ok)
    job2, a2 = _one()
    a2.top_n(uid="best", key="x", order_by="t DESC", n=1, rank_column=None).over_aggregate(
        uid="ov", key="k", event_time="t", rows_preceding=1, aggs=AGGS).sink("o")
    with pytest.raises(ConfigError, match="its sink 'o' must be mode='upsert'"):
        check_over(job2, job2.operator("ov"), ok)
    job3, a3 = _one()
    win = a3.window(uid="w", key="k", event_time="t", size_seconds=60, aggs={"c": ("count", None)}, emit="update")
    with pytest.raises(ConfigError, match="over_aggregate 'ov': its input is the updating stream of 'w'"):
        win.over_aggregate(uid="ov", key="k", event_time="window_start", rows_preceding=1, aggs={"n": ("count", None)})
    job4, a4 = _one()
    over = a4.aggregate(uid="tot", key="k", aggs={"s": ("sum", "x")}).over_aggregate(
        uid="ov", key="k", event_time="t", rows_preceding=1, aggs={"n": ("count", None)})
    over.aggregate(uid="agg", key="k", aggs={"c": ("count", None)})
    assert "reads the updating stream of over aggregate 'ov'" in (unsupported_reason(job4, job4.operator("agg")) or "")


def test_runtime_check():
    job, a = _one()
    a.over_aggregate(uid="ov", key="k", event_time="t", rows_preceding=1, aggs=AGGS).sink("o")
    ok = SimpleNamespace(checkpoint_mode=CheckpointingMode.EXACTLY_ONCE, unaligned=False, aligned_timeout_seconds=None)
    check_over(job, job.operator("ov"), ok)
    with pytest.raises(ConfigError, match="over aggregate 'ov' needs aligned exactly-once"):
        check_over(job, job.operator("ov"), SimpleNamespace(checkpoint_mode=CheckpointingMode.AT_LEAST_ONCE,
                                                            unaligned=False, aligned_timeout_seconds=None))
    job2, a2 = _one()
    a2.over_aggregate(uid="ov", key="k", event_time="t", rows_preceding=1, aggs=AGGS).sink("o", mode="upsert", key=["k"])
    with pytest.raises(ConfigError, match="its sink 'o' must be mode='append'"):
        check_over(job2, job2.operator("ov"), ok)


def test_bootstrap_does_not_refuse_it():
    job, a = _one()
    a.over_aggregate(uid="ov", key="k", event_time="t", rows_preceding=1, aggs=AGGS).sink("o")
    assert refusal(job) is None
