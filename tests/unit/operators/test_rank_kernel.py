"""Property test of the top-N kernel (``top_n`` / ``keep_last``) against DuckDB's ``row_number()`` over the rows so
far (no Epochal code in the model): rows split into rounds and subtasks, rescaled between rounds, state read whole
(heap) or for the round's keys only (RocksDB); the output of every round, applied to an upsert table keyed by
(key, rank), holds exactly the model's top-N, and the state is the same rows with their ranks."""
from __future__ import annotations

import duckdb
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import Job
from pipeline.exceptions import ConfigError
from pipeline.operators.rank import RANK, rank_step

pytestmark = pytest.mark.unit

MP = 8
TS = pa.timestamp("us", tz="UTC")
INPUT = pa.schema([("k", pa.string()), ("v", pa.int64()), ("s", pa.string()), ("_ingest_ts", TS)])
STATE = INPUT.append(pa.field("_kg", pa.int32())).append(pa.field(RANK, pa.int32()))


def _kg(k):
    return 0 if k is None else sum(map(ord, k)) % MP


def _model(seen: list[dict], n: int, desc: bool) -> set:
    """Rows (k, v, s, t, rank) of the first n per key: DuckDB's row_number in the documented order."""
    con = duckdb.connect()
    df = pd.DataFrame(seen, columns=["k", "v", "s", "_ingest_ts"]).astype({"v": "Int64"})
    con.register("rows", df)
    direction = "DESC" if desc else "ASC"
    sql = f"""SELECT k, v, s, _ingest_ts, rn FROM (SELECT *, row_number() OVER (PARTITION BY k ORDER BY
                v {direction} NULLS LAST, _ingest_ts DESC NULLS LAST, s ASC NULLS LAST) AS rn FROM rows)
              WHERE rn <= {n}"""
    return {tuple(r) for r in con.execute(sql).fetchall()}


rows_st = st.lists(st.tuples(st.sampled_from(["a", "b", "c", None]), st.one_of(st.none(), st.integers(0, 4)),
                             st.sampled_from(["x", "y", None]), st.integers(0, 6)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(rows=rows_st, n=st.integers(1, 3), desc=st.booleans(), cuts=st.lists(st.integers(0, 40), max_size=4),
       ps=st.lists(st.integers(1, 3), min_size=5, max_size=5), rocksdb=st.booleans())
def test_rank_step_equals_row_number(rows, n, desc, cuts, ps, rocksdb):
    bounds = sorted({0, len(rows), *[min(c, len(rows)) for c in cuts]})
    state = STATE.empty_table()
    sink: dict = {}                   # (k, rank) -> row: an upsert table keyed by (key, rank)
    seen: list[dict] = []
    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        batch = [dict(k=k, v=v, s=s, _ingest_ts=pd.Timestamp(t, unit="us", tz="UTC")) for k, v, s, t in rows[lo:hi]]
        seen += batch
        p = ps[i % len(ps)]           # the round's parallelism: the state is re-split by key group (rescaling)
        new_parts = []
        for sub in range(p):
            mine = [r for r in batch if _kg(r["k"]) * p // MP == sub]
            held = state.filter(pa.array([_kg(k) * p // MP == sub for k in state["k"].to_pylist()], pa.bool_()))
            if rocksdb:               # the backend reads only the rows of the round's keys
                keys = {r["k"] for r in mine}
                held = held.filter(pa.array([k in keys for k in held["k"].to_pylist()], pa.bool_()))
            new = pa.Table.from_pylist([dict(r, _kg=_kg(r["k"])) for r in mine],
                                       schema=INPUT.append(pa.field("_kg", pa.int32())))
            res = rank_step(held, new, key="k", order_by=[("v", desc)], n=n, skip=("_kg",))
            for r in res.output.to_pylist():
                sink[(r["k"], r[RANK])] = r
            touched = {r["k"] for r in mine}
            untouched = state.filter(pa.array([_kg(k) * p // MP == sub and k not in touched
                                               for k in state["k"].to_pylist()], pa.bool_()))
            if not rocksdb:           # heap: the kernel hands back the held rows of the other keys
                assert res.untouched is not None
                assert sorted(map(repr, res.untouched.to_pylist())) == sorted(map(repr, untouched.to_pylist()))
            new_parts += [untouched, res.state.select(STATE.names).cast(STATE)]
        state = pa.concat_tables(new_parts) if new_parts else state
        expected = _model(seen, n, desc)

        def norm(r):
            return (r["k"], r["v"], r["s"], r["_ingest_ts"], r[RANK])
        assert {norm(r) for r in sink.values()} == expected
        assert {norm(r) for r in state.to_pylist()} == expected
        assert state.num_rows == len(expected)        # bounded: at most n rows per key


def test_api_errors_and_keep_last_order():
    j = Job("t")
    src = j.source("s", INPUT)
    with pytest.raises(ConfigError, match="n must be"):
        src.top_n(uid="a", key="k", order_by="v", n=0)
    with pytest.raises(ConfigError, match="rank_column=None"):
        src.top_n(uid="b", key="k", order_by="v", n=2, rank_column=None)
    with pytest.raises(ConfigError, match="order_by term"):
        src.top_n(uid="c", key="k", order_by="v DESCENDING", n=2)
    with pytest.raises(ConfigError, match="order_by names a key"):
        src.top_n(uid="d", key=["k", "s"], order_by="s", n=2)
    last = j.nodes[src.keep_last(uid="e", key=["k", "s"], order_by="v").node]
    assert last.order_by == (("v", True),) and last.n == 1 and last.rank_column is None
    assert last.key == "__rank_key" and last.sink_key == ("k", "s")
    top = src.top_n(uid="f", key="k", order_by=["v DESC", "s"], n=3)
    assert j.nodes[top.node].order_by == (("v", True), ("s", False))
    sink = j.nodes[top.sink("t", mode="upsert").node]
    assert sink.key == ("k", "rank_number")
