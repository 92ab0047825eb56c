"""The job API of ``Stream.window`` / ``Stream.process``: arguments validated before any side effect."""
from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline.exceptions import ConfigError
from pipeline.job import Job, ProcessNode, WindowNode

pytestmark = pytest.mark.unit

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("k", pa.string()), ("et", TS), ("v", pa.float64()), ("_ingest_ts", TS)])


def _src():
    job = Job("api")
    return job, job.source("s", SCHEMA)


def test_window_defaults_and_sink_key():
    job, s = _src()
    w = s.window(uid="w", key="k", event_time="et", size_seconds=60, aggs={"n": ("count", None), "a": ("avg", "v")})
    node = job.nodes[w.node]
    assert isinstance(node, WindowNode) and node.slide_seconds == 60 and node.emit == "final"
    w.sink("out", mode="upsert")
    assert job.sinks()[0].key == ("k", "window_start")
    assert job.state_names("w") == ("win", "wm")
    assert {"_source", "_partition", "et", "v", "k"} <= job.columns_read(0)


@pytest.mark.parametrize("kw, msg", [
    ({"size_seconds": 60, "slide_seconds": 25}, "positive multiple"),
    ({"size_seconds": 0}, "positive multiple"),
    ({"size_seconds": 60, "slide_seconds": 120}, "positive multiple"),
    ({"size_seconds": 60, "max_out_of_orderness_seconds": -1}, "non-negative"),
    ({"size_seconds": 60, "allowed_lateness_seconds": 1.5}, "non-negative whole"),
    ({"size_seconds": 60, "emit": "sometimes"}, "emit must be"),
    ({"size_seconds": 60, "aggs": {"x": ("median", "v")}}, "unknown function"),
    ({"size_seconds": 60, "aggs": {"x": ("sum", None)}}, "needs an input column"),
    ({"size_seconds": 60, "aggs": {"window_start": ("count", None)}}, "clashes"),
    ({"size_seconds": 60, "aggs": {}}, "no aggregations"),
])
def test_window_rejects_bad_arguments(kw, msg):
    _, s = _src()
    args = {"uid": "w", "key": "k", "event_time": "et", "aggs": {"n": ("count", None)}, **kw}
    with pytest.raises(ConfigError, match=msg):
        s.window(**args)


def test_process_validation():
    job, s = _src()
    st = pa.schema([("k", pa.string()), ("n", pa.int64())])
    p = s.process(uid="p", key="k", fn=lambda r, x: (x, r), state_schema=st, output_schema=SCHEMA, ttl_seconds=60)
    assert isinstance(job.nodes[p.node], ProcessNode) and job.state_names("p") == ("proc",)
    with pytest.raises(ConfigError, match="must contain the key"):
        s.process(uid="p2", key="z", fn=len, state_schema=st, output_schema=SCHEMA)
    with pytest.raises(ConfigError, match="callable"):
        s.process(uid="p3", key="k", fn=1, state_schema=st, output_schema=SCHEMA)
    with pytest.raises(ConfigError, match="reserved"):
        s.process(uid="p4", key="k", fn=len, state_schema=st.append(pa.field("_kg", pa.int32())),
                  output_schema=SCHEMA)
    with pytest.raises(ConfigError, match="ttl_seconds"):
        s.process(uid="p5", key="k", fn=len, state_schema=st, output_schema=SCHEMA, ttl_seconds=0)
    with pytest.raises(ConfigError, match="used twice"):
        s.process(uid="p", key="k", fn=len, state_schema=st, output_schema=SCHEMA)


@pytest.mark.parametrize("kw, msg", [
    ({"key": "nope"}, r"window 'w': the input lacks columns \['nope'\]"),
    ({"event_time": "when"}, r"lacks columns \['when'\]"),
    ({"aggs": {"x": ("sum", "price")}}, r"lacks columns \['price'\]"),
    ({"event_time": "v"}, "event_time 'v' must be a timestamp, is double"),
])
def test_a_window_over_columns_its_input_lacks_is_refused_when_the_job_is_built(kw, msg):
    """Before any JVM: the graph decides the input's schema (a source, filters, plain selects)."""
    job, s = _src()
    args = {"uid": "w", "key": "k", "event_time": "et", "size_seconds": 60, "aggs": {"n": ("count", None)}, **kw}
    with pytest.raises(ConfigError, match=msg):
        s.filter("v > 0").window(**args)
    gap = {k: v for k, v in args.items() if k != "size_seconds"}
    with pytest.raises(ConfigError, match=msg.replace("window 'w'", "session window 'w'")):
        s.session_window(gap_seconds=30, **gap)


def test_a_window_on_the_arrival_time_of_a_joins_rows_is_refused():
    """A join's output carries no ``_ingest_ts`` (a pair has two): refused when the job is built, naming the join,
    not when the plan meets the missing column."""
    job, s = _src()
    other = job.source("o", pa.schema([("k", pa.string()), ("w", pa.float64()), ("_ingest_ts", TS)]))
    pairs = s.join(other, on="k", uid="j")
    with pytest.raises(ConfigError, match="event_time '_ingest_ts' is not a column of join 'j'"):
        pairs.window(uid="w", key="k", event_time="_ingest_ts", size_seconds=60, aggs={"n": ("count", None)})
    pairs.window(uid="w2", key="k", event_time="et", size_seconds=60, aggs={"n": ("count", None)})  # a side's column
