"""Property test of the running aggregate's kernel (avg, count_distinct, filtered aggregates, and the others)
against DuckDB's SQL over the rows so far (no Epochal code in the model), with rows split into rounds and
subtasks, rescaled between rounds, and the state read whole (heap) or for the round's keys only (RocksDB)."""
from __future__ import annotations

import math
from decimal import Decimal

import duckdb
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.exceptions import ConfigError
from pipeline.operators.aggregate_functions import (
    KG,
    aggregate_step,
    mask_sql,
    masked_aggs,
    output_fields,
    parse_aggs,
    state_fields,
)

pytestmark = pytest.mark.unit

MP = 8
INPUT = pa.schema([("k", pa.string()), ("v", pa.int64()), ("f", pa.float64()), ("s", pa.string()),
                   ("flag", pa.bool_())])
AGGS = {"n": ("count", None), "total": ("sum", "v"), "lo": ("min", "v"), "hi": ("max", "s"),
        "mean": ("avg", "f"), "mean_v": ("avg", "v"), "users": ("count_distinct", "s"), "vals": ("count_distinct", "v"),
        "n_flag": ("count", None, "flag"), "total_flag": ("sum", "v", "flag AND v > 0"),
        "mean_flag": ("avg", "f", "flag"), "users_flag": ("count_distinct", "s", "flag"),
        "hi_flag": ("max", "f", "flag")}
SQL = """SELECT k, count(*) AS n, sum(v) AS total, min(v) AS lo, max(s) AS hi,
  CAST(sum(CAST(f AS DECIMAL(38, 9))) AS DOUBLE) / count(f) AS mean, avg(f) AS mean_approx,
  CAST(sum(v) AS DOUBLE) / count(v) AS mean_v,
  count(DISTINCT s) AS users, count(DISTINCT v) AS vals,
  count(*) FILTER (WHERE flag) AS n_flag, sum(v) FILTER (WHERE flag AND v > 0) AS total_flag,
  CAST(sum(CAST(f AS DECIMAL(38, 9))) FILTER (WHERE flag) AS DOUBLE) / count(f) FILTER (WHERE flag) AS mean_flag,
  count(DISTINCT s) FILTER (WHERE flag) AS users_flag, max(f) FILTER (WHERE flag) AS hi_flag
FROM rows GROUP BY k"""


def _kg(k):
    return 0 if k is None else sum(map(ord, k)) % MP


def _subtask(kg: int, p: int) -> int:
    return kg * p // MP


def _masked(rows: pa.Table, aggs, filters) -> pa.Table:
    """What Spark's ``mask_sql`` expressions compute, written here with pandas (CASE WHEN cond THEN col END)."""
    df = rows.to_pandas()
    flag = df["flag"].astype("boolean").fillna(False).astype(bool)
    conds = {"flag": flag,
             "flag AND v > 0": flag & (df["v"].astype("Int64").fillna(0) > 0)}
    for (name, _expr), (out, cond) in zip(mask_sql(aggs, filters), filters):
        fn = dict((o, f) for o, f, _ in aggs)[out]
        col = dict((o, c) for o, _, c in aggs)[out]
        c = conds[cond]
        if fn == "count":
            rows = rows.append_column(name, pa.array(c.astype("int64").to_numpy()))
        else:
            rows = rows.append_column(name, pa.array([x if ok else None for x, ok in
                                                      zip(rows[col].to_pylist(), c)], rows.schema.field(col).type))
    return rows


def _model(seen: list[dict]) -> dict:
    con = duckdb.connect()
    con.register("rows", pd.DataFrame(seen, columns=INPUT.names).astype(
        {"v": "Int64", "f": "Float64", "flag": "boolean"}))
    out = {}
    for r in con.execute(SQL).fetch_arrow_table().to_pylist():
        if r["mean"] is not None and r["mean_approx"] is not None:
            assert math.isclose(r["mean"], r["mean_approx"], rel_tol=1e-9)  # the exact avg is SQL's avg
        out[r["k"]] = {k: v for k, v in r.items() if k != "mean_approx"}
    return out


rows_st = st.lists(st.fixed_dictionaries({
    "k": st.sampled_from(["a", "b", "c", "d", "e", None]),
    "v": st.one_of(st.none(), st.integers(-5, 5), st.sampled_from([2 ** 62, -(2 ** 62)])),
    "f": st.one_of(st.none(), st.integers(-10_000, 10_000).map(lambda i: i / 100)),
    "s": st.one_of(st.none(), st.sampled_from(["x", "y", "z", "w"])),
    "flag": st.one_of(st.none(), st.booleans())}), min_size=0, max_size=25)


@settings(max_examples=60, deadline=None)
@given(rounds=st.lists(st.tuples(rows_st, st.integers(1, 3), st.booleans()), min_size=1, max_size=5))
def test_kernel_equals_duckdb(rounds):
    aggs, filters = parse_aggs("aggregate t", AGGS)
    kaggs = masked_aggs(aggs, filters)
    in_schema = _masked(INPUT.empty_table(), aggs, filters).schema
    sschema = pa.schema([INPUT.field("k"), *state_fields(kaggs, in_schema), pa.field(KG, pa.int32())])
    oschema = pa.schema([INPUT.field("k"), *output_fields(aggs, INPUT)])
    assert oschema == pa.schema([INPUT.field("k"), *output_fields(kaggs, in_schema)])
    state = sschema.empty_table()      # every subtask's state, concatenated (rescaling re-splits it)
    seen: list[dict] = []
    for batch, p, whole in rounds:
        big = [r for r in batch if r["v"] is not None and abs(r["v"]) > 5]
        if len(big) > 1:
            batch = [r for r in batch if r not in big[1:]]  # at most one huge value per round: no int64 overflow
        seen += batch
        # no int64 overflow in any sum, filtered ones included (a filter may keep only the positive values):
        # the sum of the absolute values bounds every subset's sum
        if any(sum(abs(r["v"]) for r in seen if r["k"] == k and r["v"] is not None) >= 2 ** 63
               for k in {r["k"] for r in seen}):
            return
        rows = pa.Table.from_pylist(batch, INPUT)
        rows = _masked(rows, aggs, filters).append_column(KG, pa.array([_kg(k) for k in rows["k"].to_pylist()],
                                                                        pa.int32()))
        model = _model(seen)
        parts = []
        emitted = {}
        for sub in range(p):
            mine = rows.filter(pa.array([_subtask(g, p) == sub for g in rows[KG].to_pylist()], pa.bool_()))
            held = state.filter(pa.array([_subtask(g, p) == sub for g in state[KG].to_pylist()], pa.bool_()))
            keys = set(mine["k"].to_pylist())
            if not whole:  # RocksDB: only the round's groups are read; the others stay as they are
                other = held.filter(pa.array([k not in keys for k in held["k"].to_pylist()], pa.bool_()))
                held = held.filter(pa.array([k in keys for k in held["k"].to_pylist()], pa.bool_()))
                parts.append(other)
            res = aggregate_step("k", kaggs, sschema, oschema, held, mine, where="aggregate t")
            assert sorted(res.touched["k"].to_pylist(), key=str) == sorted(keys, key=str)
            parts.append(res.state)
            for r in res.output.to_pylist():
                assert r["k"] not in emitted
                emitted[r["k"]] = r
        state = pa.concat_tables(parts)
        assert sorted(state["k"].to_pylist(), key=str) == sorted({r["k"] for r in seen}, key=str)
        assert set(emitted) == set(rows["k"].to_pylist())
        for k, got in emitted.items():
            assert got == model[k], (k, got, model[k])
        # the state: avg as (exact sum, count), distinct values as a sorted list
        for r in state.to_pylist():
            mine = [x for x in seen if x["k"] == r["k"]]
            assert r["users__set"] == sorted({x["s"] for x in mine if x["s"] is not None})
            assert r["mean__count"] == sum(x["f"] is not None for x in mine)
            fs = [Decimal(str(x["f"])) for x in mine if x["f"] is not None]
            assert r["mean__sum"] == (sum(fs) if fs else None)


def test_avg_of_no_value_is_null_and_count_distinct_zero():
    aggs, filters = parse_aggs("aggregate t", {"m": ("avg", "v"), "d": ("count_distinct", "v"),
                                               "c": ("count", None, "v > 100")})
    kaggs = masked_aggs(aggs, filters)
    schema = pa.schema([("k", pa.string()), ("v", pa.int64()), ("__where_c", pa.int64()), (KG, pa.int32())])
    sschema = pa.schema([schema.field("k"), *state_fields(kaggs, schema), pa.field(KG, pa.int32())])
    oschema = pa.schema([schema.field("k"), *output_fields(kaggs, schema)])
    rows = pa.table({"k": ["a", "a"], "v": [None, None], "__where_c": [0, 0], KG: [1, 1]}, schema=schema)
    res = aggregate_step("k", kaggs, sschema, oschema, sschema.empty_table(), rows)
    assert res.output.to_pylist() == [{"k": "a", "m": None, "d": 0, "c": 0}]


def test_api_errors():
    with pytest.raises(ConfigError, match="unknown function 'median'"):
        parse_aggs("aggregate t", {"m": ("median", "v")})
    with pytest.raises(ConfigError, match="must be a Spark SQL condition"):
        parse_aggs("aggregate t", {"m": ("sum", "v", "")})
    with pytest.raises(ConfigError, match="clash with the state columns"):
        parse_aggs("aggregate t", {"m": ("avg", "v"), "m__sum": ("sum", "v")})
