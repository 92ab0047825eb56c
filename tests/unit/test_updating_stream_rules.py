"""Which nodes exchange a changelog (pipeline.updating_streams): an aggregate reading a running aggregate through
filters, selects and unions reads it; every other consumer does not; unsupported updating inputs are named."""
from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline import Job
from pipeline.updating_streams import (
    deleting_producers,
    emits_changelog,
    join_unsupported_reason,
    reads_changelog,
    sink_deletes,
    unsupported_reason,
    writer_reads_changelog,
)

pytestmark = pytest.mark.unit

TS = pa.timestamp("us", tz="UTC")
S = pa.schema([("id", pa.string()), ("g", pa.string()), ("v", pa.int64()), ("_ingest_ts", TS)])


def _job():
    job = Job("u")
    src = job.source("s", S, key="id")
    per_id = src.aggregate(uid="per_id", key="id", aggs={"total": ("sum", "v"), "g": ("max", "g")})
    return job, src, per_id


def test_an_aggregate_through_filters_selects_and_unions_reads_the_changelog():
    job, src, per_id = _job()
    mapped = per_id.filter("total > 0").select("g", "total AS v", "id")
    other = job.source("t", pa.schema([("g", pa.string()), ("v", pa.int64()), ("id", pa.string()),
                                       ("_ingest_ts", TS)]), key="id")
    per_g = mapped.union(other.select("g", "v", "id")).aggregate(uid="per_g", key="g", aggs={"n": ("count", None),
                                                                                            "s": ("avg", "v")})
    top = per_g.aggregate(uid="top", key="g", aggs={"n": ("sum", "n")})
    plain = src.aggregate(uid="plain", key="g", aggs={"n": ("count", None)})
    ops = {o.uid: o for o in job.operators()}
    assert reads_changelog(job, ops["per_g"]) and reads_changelog(job, ops["top"])
    assert not reads_changelog(job, ops["per_id"]) and not reads_changelog(job, ops["plain"])
    assert emits_changelog(job, per_id.node) and emits_changelog(job, per_g.node)
    assert not emits_changelog(job, top.node) and not emits_changelog(job, plain.node)
    assert all(unsupported_reason(job, o) is None for o in job.operators())


def test_other_consumers_read_the_added_rows():
    job, src, per_id = _job()
    per_id.deduplicate(uid="d", key="g")
    per_id.top_n(uid="t", key="g", order_by="total DESC", n=2)
    assert not emits_changelog(job, per_id.node)
    assert not any(reads_changelog(job, o) for o in job.operators())


def test_a_join_of_an_updating_stream_retracts_and_its_sinks_delete():
    job, src, per_id = _job()
    j = per_id.select("id AS k", "total").join(src.select("id AS k", "v"), on="k", uid="j")
    j.filter("v >= total").sink("hot", mode="upsert", key=["k", "v"])
    ops = {o.uid: o for o in job.operators()}
    assert reads_changelog(job, ops["j"]) and emits_changelog(job, per_id.node) and emits_changelog(job, j.node)
    assert job.node_id(ops["j"]) in deleting_producers(job)
    assert job.operator_sink(j.node) is None   # a sink writer applies its changelog as rows and deletes
    hot = job.sinks()[0]
    assert sink_deletes(job, hot) and writer_reads_changelog(job, hot)
    assert join_unsupported_reason(job, ops["j"]) is None
    # a per-id aggregate's own upsert sink over an append stream never deletes
    per_id.sink("totals", mode="upsert")
    assert not sink_deletes(job, job.sinks()[1])


@pytest.mark.parametrize("shape, named", [
    ("outer", "only an inner join without unique="),
    ("append", "sink 'out' appends the output of join 'j'"),
    ("dedup", "DedupNode 'd' reads the output of join 'j'"),
    ("partitioned", "sink 'out' deletes rows (an updating stream reaches it) but is partitioned by ['g']"),
])
def test_what_a_retracting_join_cannot_do_is_named(shape, named):
    job, src, per_id = _job()
    j = per_id.select("id AS k", "total").join(src.select("id AS k", "v"), on="k", uid="j",
                                               how="left" if shape == "outer" else "inner")
    if shape == "append":
        j.sink("out")
    if shape == "dedup":
        j.deduplicate(uid="d", key="k")
    if shape == "partitioned":
        j.select("k", "v", "'x' AS g").sink("out", mode="upsert", key=["k", "v"], partition_by=["g"])
    op = next(o for o in job.operators() if o.uid == "j")
    assert named in (join_unsupported_reason(job, op) or "")


def test_unsupported_updating_inputs_are_named_and_a_top_n_emits_a_changelog():
    job, src, per_id = _job()
    bad = per_id.aggregate(uid="best", key="g", aggs={"hi": ("max", "total"), "n": ("count", None)})
    last = src.keep_last(uid="last", key="id", order_by="v").aggregate(uid="per_last", key="g",
                                                                      aggs={"n": ("count", None)})
    win = src.window(uid="w", key="g", event_time="_ingest_ts", size_seconds=60, aggs={"n": ("count", None)},
                     emit="update").aggregate(uid="per_win", key="g", aggs={"n": ("sum", "n")})
    ops = {o.uid: o for o in job.operators()}
    assert "['hi']" in unsupported_reason(job, ops["best"]) and "best" in unsupported_reason(job, ops["best"])
    assert unsupported_reason(job, ops["per_last"]) is None and reads_changelog(job, ops["per_last"])
    assert emits_changelog(job, job.node_id(ops["last"]))
    assert "window 'w' (emit='update')" in unsupported_reason(job, ops["per_win"])
    assert bad.node and last.node and win.node
