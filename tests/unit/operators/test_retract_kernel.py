"""Property test of the retraction kernel (an aggregate over an updating stream, ``pipeline.operators.retract``)
against a plain-Python model: a map "upstream key -> its latest row", grouped by the downstream key after every
round. The changelog is what an upstream running aggregate emits (per round and changed upstream key: its previous
row retracted, its new row added); its rows are shuffled within a round and split over 1-3 subtasks by key group,
with the parallelism changing between rounds (a rescale), the state read whole (heap) or for the round's keys only
(RocksDB)."""
from __future__ import annotations

import random
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.operators.retract import (
    KG,
    ROWS,
    SIGN,
    changelog,
    kernel_aggs,
    output_fields,
    retract_step,
    state_fields,
    unretractable,
)

pytestmark = pytest.mark.unit

MP = 8
FLOW = pa.schema([("u", pa.int64()), ("d", pa.string()), ("v", pa.int64()), ("f", pa.float64())])
AGGS = (("n", "count", None), ("total", "sum", "v"), ("mean", "avg", "f"), ("mean_v", "avg", "v"),
        ("n_big", "count", None), ("total_big", "sum", "v"))
FILTERS = (("n_big", "v > 5"), ("total_big", "v > 5"))
MASK = "__where_"


def _kg(d):
    return 0 if d is None else sum(map(ord, d)) % MP


def _masked(rows: pa.Table) -> pa.Table:
    """What Spark's mask expressions compute (CASE WHEN v > 5 THEN 1 ELSE 0 END, CASE WHEN v > 5 THEN v END)."""
    big = pc.fill_null(pc.greater(rows["v"], 5), False)
    rows = rows.append_column(MASK + "n_big", pc.cast(big, pa.int64()))
    return rows.append_column(MASK + "total_big", pc.if_else(big, rows["v"], pa.scalar(None, pa.int64())))


def _model(latest: dict) -> dict:
    """Per downstream key: the values of its group over the latest row of every upstream key."""
    groups: dict = {}
    for d, v, f in latest.values():
        groups.setdefault(d, []).append((v, f))
    out = {}
    for d, rows in groups.items():
        vs = [v for v, _ in rows if v is not None]
        fs = [Decimal(repr(f)).quantize(Decimal("1e-9")) for _, f in rows if f is not None]
        big = [v for v in vs if v > 5]
        out[d] = {"n": len(rows), "total": sum(vs) if vs else None,
                  "mean": float(sum(fs)) / len(fs) if fs else None,
                  "mean_v": float(sum(vs)) / len(vs) if vs else None,
                  "n_big": len(big), "total_big": sum(big) if big else None}
    return out


_row = st.tuples(st.integers(0, 6),                                   # upstream key
                 st.sampled_from(["a", "b", "c", None]),              # downstream key (may move)
                 st.one_of(st.none(), st.integers(-9, 12)),
                 st.one_of(st.none(), st.floats(-1e3, 1e3, allow_nan=False).map(lambda x: round(x, 3))))


@settings(max_examples=150, deadline=None)
@given(rounds=st.lists(st.lists(_row, max_size=12), min_size=1, max_size=6),
       ps=st.lists(st.integers(1, 3), min_size=6, max_size=6), per_key=st.booleans(), seed=st.integers(0, 10**6))
def test_retract_kernel_matches_the_model(rounds, ps, per_key, seed):
    rng = random.Random(seed)
    aggs = kernel_aggs(AGGS, FILTERS, MASK)
    in_schema = _masked(FLOW.empty_table()).schema
    sschema = pa.schema([pa.field("d", pa.string())] + state_fields(aggs, in_schema) + [pa.field(KG, pa.int32())])
    oschema = pa.schema([pa.field("d", pa.string())] + output_fields(aggs, in_schema))
    state: dict[int, pa.Table] = {}          # key group -> its held rows
    latest: dict = {}
    sink: dict = {}                          # an upsert sink of the output: the newest row per group
    for r, updates in enumerate(rounds):
        # the upstream: per changed upstream key in this round, its previous row retracted and its new row added
        round_latest = dict(latest)
        for u, d, v, f in updates:
            round_latest[u] = (d, v, f)
        changed = {u for u, *_ in updates}
        old = [{"u": u, "d": latest[u][0], "v": latest[u][1], "f": latest[u][2]} for u in changed if u in latest]
        new = [{"u": u, "d": round_latest[u][0], "v": round_latest[u][1], "f": round_latest[u][2]} for u in changed]
        flow = changelog(pa.Table.from_pylist(old, FLOW), pa.Table.from_pylist(new, FLOW), FLOW,
                         "u" if seed % 2 else None)   # unchanged rows: no retraction and addition, or a pair
        latest = round_latest
        rows = flow.to_pylist() if flow is not None else []
        rng.shuffle(rows)
        rows_t = _masked(pa.Table.from_pylist(rows, FLOW.append(pa.field(SIGN, pa.int32()))))
        rows_t = rows_t.append_column(KG, pa.array([_kg(d) for d in rows_t["d"].to_pylist()], pa.int32()))
        p = ps[r]
        outputs = []
        for sub in range(p):
            kgs = [kg for kg in range(MP) if kg * p // MP == sub]
            mine = rows_t.filter(pc.is_in(rows_t[KG], value_set=pa.array(kgs, pa.int32())))
            held = [state[kg] for kg in kgs if kg in state]
            held_t = pa.concat_tables(held) if held else sschema.empty_table()
            if per_key:   # RocksDB: only the rows of the round's keys are read
                held_t = held_t.filter(pc.is_in(held_t["d"], value_set=mine["d"], skip_nulls=False))
            res = retract_step("d", aggs, sschema, oschema, held_t, mine)
            for kg in kgs:
                kept = res.state.filter(pc.equal(res.state[KG], kg))
                if per_key:   # untouched held rows stay as they were
                    before = state.get(kg, sschema.empty_table())
                    before = before.filter(pc.invert(pc.is_in(before["d"], value_set=mine["d"], skip_nulls=False)))
                    kept = pa.concat_tables([before, kept])
                state[kg] = kept
            outputs.append(res.output)
            prev = {x["d"]: x for x in res.previous.to_pylist()}
            assert set(prev) <= set(x["d"] for x in res.output.to_pylist())
        model = _model(latest)
        held_all = pa.concat_tables(list(state.values())) if state else sschema.empty_table()
        assert sorted(held_all["d"].to_pylist(), key=str) == sorted(model, key=str)
        assert all(n > 0 for n in held_all[ROWS].to_pylist())
        empty = {"n": 0, "total": None, "mean": None, "mean_v": None, "n_big": 0, "total_big": None}
        for row in pa.concat_tables(outputs).to_pylist():
            want = model.get(row["d"], empty)
            got = {k: row[k] for k in want}
            assert _same(got, want), (row, want)
            sink[row["d"]] = got
        # the sink holds every group's values: an emptied group its empty values (sinks do not delete rows)
        for d, got in sink.items():
            assert _same(got, model.get(d, empty)), (d, got, model.get(d))
        assert set(model) <= set(sink)


def _same(got: dict, want: dict) -> bool:
    for k, w in want.items():
        g = got[k]
        if w is None or g is None:
            if w is not g:
                return False
        elif isinstance(w, float):
            if g != w:
                return False
        elif g != w:
            return False
    return True


def test_min_max_and_count_distinct_are_not_retractable():
    assert unretractable((("a", "min", "v"), ("b", "max", "v"), ("c", "count_distinct", "v"),
                          ("d", "sum", "v"), ("e", "avg", "v"), ("n", "count", None))) == ["a", "b", "c"]


def test_a_retraction_without_its_row_is_refused():
    aggs = (("n", "count", None),)
    sschema = pa.schema([pa.field("d", pa.string())] + state_fields(aggs, FLOW) + [pa.field(KG, pa.int32())])
    oschema = pa.schema([pa.field("d", pa.string())] + output_fields(aggs, FLOW))
    rows = pa.table({"d": ["a"], SIGN: pa.array([-1], pa.int32()), KG: pa.array([1], pa.int32())})
    with pytest.raises(RuntimeError, match="retracted more rows"):
        retract_step("d", aggs, sschema, oschema, sschema.empty_table(), rows, where="operator 'x'")


def test_a_group_whose_row_did_not_change_emits_nothing():
    schema = pa.schema([("k", pa.string()), ("top", pa.int64()), ("cat", pa.string())])
    prev = pa.table({"k": ["a", "b", None, "c"], "top": [5, 7, 1, None], "cat": ["x", "y", None, "z"]}, schema=schema)
    cur = pa.table({"k": ["a", "b", None, "c", "d"], "top": [5, 9, 1, None, 2], "cat": ["x", "y", None, "z", "w"]},
                   schema=schema)
    out = changelog(prev, cur, schema, "k").to_pylist()
    assert out == [{"k": "b", "top": 7, "cat": "y", SIGN: -1}, {"k": "b", "top": 9, "cat": "y", SIGN: 1},
                   {"k": "d", "top": 2, "cat": "w", SIGN: 1}]
    assert changelog(prev, prev, schema, "k") is None
