"""``Stream.interval_join`` / ``Stream.temporal_join``: what the job graph refuses when it is built (before any side
effect), each error naming the operator; and the runtime check (aligned exactly-once checkpoints, append sinks)."""
from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest

from pipeline import Job
from pipeline.barriers.events import CheckpointingMode
from pipeline.exceptions import ConfigError
from pipeline.job import IntervalJoinNode, TemporalJoinNode
from pipeline.runtime.operators.timed_join import check_timed_join

pytestmark = pytest.mark.unit

TS = pa.timestamp("us", tz="UTC")
A = pa.schema([("k", pa.string()), ("t", TS), ("x", pa.int64()), ("_ingest_ts", TS)])
B = pa.schema([("k", pa.string()), ("u", TS), ("y", pa.int64()), ("_ingest_ts", TS)])


def _two():
    job = Job("j")
    return job, job.source("a", A, key="k"), job.source("b", B, key="k")


def test_nodes_and_state_names():
    job, a, b = _two()
    a.interval_join(b, uid="ij", on="k", left_time="t", right_time="u", lower_seconds=-5, upper_seconds=10).sink("o1")
    a.temporal_join(b, uid="tj", on="k", time="t", version_time="u", how="left").sink("o2")
    ij, tj = job.operator("ij"), job.operator("tj")
    assert isinstance(ij, IntervalJoinNode) and ij.inputs == (0, 1) and job.state_names("ij") == ("left", "right", "wm")
    assert isinstance(tj, TemporalJoinNode) and tj.how == "left" and job.state_names("tj") == ("left", "right", "wm")


@pytest.mark.parametrize("call, message", [
    (lambda a, b: a.interval_join(b, uid="ij", on="k", left_time="t", right_time="u", lower_seconds=5,
                                  upper_seconds=1), "interval_join 'ij': lower_seconds (5) is above"),
    (lambda a, b: a.interval_join(b, uid="ij", on="k", left_time="t", right_time="u", lower_seconds=0.5,
                                  upper_seconds=1), "interval_join 'ij': lower_seconds must be a whole number"),
    (lambda a, b: a.interval_join(a, uid="ij", on="k", left_time="t", right_time="t", lower_seconds=0,
                                  upper_seconds=1), "both inputs are the same stream"),
    (lambda a, b: a.interval_join(b.select("k", "u", "y AS x"), uid="ij", on="k", left_time="t", right_time="u",
                                  lower_seconds=0, upper_seconds=1), "both inputs have the columns ['x']"),
    (lambda a, b: a.temporal_join(b, uid="tj", on="k", time="x", version_time="u"),
     "temporal_join 'tj': the left time column 'x' must be a timestamp"),
    (lambda a, b: a.temporal_join(b, uid="tj", on="k", time="t", version_time="nope"),
     "temporal_join 'tj': the right input lacks columns ['nope']"),
    (lambda a, b: a.temporal_join(b, uid="tj", on="k", time="t", version_time="u", how="full"),
     "temporal_join 'tj': how='full'"),
    (lambda a, b: a.temporal_join(b, uid="tj", on="k", time="t", version_time="u", max_out_of_orderness_seconds=-1),
     "max_out_of_orderness_seconds must be a non-negative"),
    (lambda a, b: a.temporal_join(b.aggregate(uid="agg", key="k", aggs={"n": ("count", None)}).select(
        "k", "n", "current_timestamp() AS u"), uid="tj", on="k", time="t", version_time="u"),
     "the right input is the updating stream of 'agg'"),
])
def test_refused_when_the_job_is_built(call, message):
    _job, a, b = _two()
    with pytest.raises(ConfigError) as e:
        call(a, b)
    assert message in str(e.value)


def test_runtime_check_needs_aligned_exactly_once_and_append_sinks():
    job, a, b = _two()
    a.interval_join(b, uid="ij", on="k", left_time="t", right_time="u", lower_seconds=0, upper_seconds=1).sink("o")
    ok = SimpleNamespace(checkpoint_mode=CheckpointingMode.EXACTLY_ONCE, unaligned=False, aligned_timeout_seconds=None)
    check_timed_join(job, job.operator("ij"), ok)
    for bad in (SimpleNamespace(checkpoint_mode=CheckpointingMode.AT_LEAST_ONCE, unaligned=False,
                                aligned_timeout_seconds=None),
                SimpleNamespace(checkpoint_mode=CheckpointingMode.EXACTLY_ONCE, unaligned=True,
                                aligned_timeout_seconds=None)):
        with pytest.raises(ConfigError, match="interval join 'ij' needs aligned exactly-once"):
            check_timed_join(job, job.operator("ij"), bad)
    job2, a2, b2 = _two()
    a2.temporal_join(b2, uid="tj", on="k", time="t", version_time="u").sink("o", mode="upsert", key=["k"])
    with pytest.raises(ConfigError, match="its sink 'o' must be mode='append'"):
        check_timed_join(job2, job2.operator("tj"), ok)
