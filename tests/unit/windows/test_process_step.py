"""``process_step`` (the user-defined stateful operator) against a per-record model: a running per-key session
counter with TTL, split over subtasks that change between epochs, plus the contract checks on ``fn``."""
from __future__ import annotations

import zlib

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.exceptions import UserFunctionError
from pipeline.operators.process import TOUCHED, process_step

pytestmark = pytest.mark.unit

STATE = pa.schema([("k", pa.string()), ("total", pa.int64()), ("seen", pa.int64())])
OUT = pa.schema([("k", pa.string()), ("total", pa.int64()), ("first", pa.bool_())])


def running_total(rows: pa.Table, state: pa.Table):
    """Vectorised: per key, add this call's sum to the state; emit the new total; forget keys whose total
    reaches >= 100 (state deletion by omission)."""
    g = rows.group_by("k", use_threads=False).aggregate([("v", "sum"), ("v", "count")])
    joined = g.join(state, keys="k", join_type="left outer")
    total = pc.add(pc.fill_null(joined["total"], 0), joined["v_sum"])
    seen = pc.add(pc.fill_null(joined["seen"], 0), joined["v_count"])
    out = pa.table({"k": joined["k"], "total": total, "first": pc.is_null(joined["total"])})
    keep = pc.less(total, 100)
    new_state = pa.table({"k": joined["k"], "total": total, "seen": seen}).filter(keep)
    return new_state, out


def model(epochs, ttl):
    state: dict[str, tuple[int, int, int]] = {}   # k -> (total, seen, touched epoch)
    outs = []
    for m, recs in enumerate(epochs):
        if ttl is not None:
            state = {k: v for k, v in state.items() if v[2] >= m - ttl}
        out = []
        for k in sorted({k for k, _ in recs}):
            vs = [v for kk, v in recs if kk == k]
            old = state.get(k)
            total = (old[0] if old else 0) + sum(vs)
            out.append((k, total, old is None))
            if total < 100:
                state[k] = (total, (old[1] if old else 0) + len(vs), m)
            else:
                state.pop(k, None)
        outs.append((sorted(out), sorted((k, t, s) for k, (t, s, _) in state.items())))
    return outs


def run(epochs, ttl, parallelisms):
    state = None
    res = []
    for m, recs in enumerate(epochs):
        P = parallelisms[m % len(parallelisms)]
        rows = pa.table({"k": [k for k, _ in recs], "v": [v for _, v in recs]},
                        schema=pa.schema([("k", pa.string()), ("v", pa.int64())]))
        outs, states = [], []
        for i in range(P):
            def own(t, P=P, i=i):
                return pa.array([zlib.crc32(k.encode()) % P == i for k in t["k"].to_pylist()], pa.bool_())
            st_i = state.filter(own(state)) if state is not None else STATE.append(
                pa.field(TOUCHED, pa.int64())).empty_table()
            r = process_step("counter", "k", running_total, STATE, OUT, st_i, rows.filter(own(rows)),
                             barrier_us=m, ttl_us=ttl)
            outs.append(r.output)
            states.append(r.state)
        state = pa.concat_tables(states)
        out = pa.concat_tables(outs)
        res.append((sorted((r["k"], r["total"], r["first"]) for r in out.to_pylist()),
                    sorted((r["k"], r["total"], r["seen"]) for r in state.to_pylist())))
    return res


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.tuples(st.sampled_from(list("abcde")), st.integers(0, 40)), max_size=15),
                min_size=1, max_size=6),
       st.one_of(st.none(), st.integers(0, 3)), st.lists(st.integers(1, 3), min_size=1, max_size=3))
def test_process_step_matches_the_model(epochs, ttl, parallelisms):
    assert run(epochs, ttl, parallelisms) == model(epochs, ttl)


def _call(fn, rows=None):
    rows = rows if rows is not None else pa.table({"k": ["a", "b"], "v": [1, 2]})
    return process_step("p1", "k", fn, STATE, OUT, STATE.append(pa.field(TOUCHED, pa.int64())).empty_table(),
                        rows, barrier_us=0, ttl_us=None)


def test_fn_contract_violations_name_the_operator():
    with pytest.raises(UserFunctionError, match="p1: fn raised ZeroDivisionError"):
        _call(lambda r, s: 1 / 0)
    with pytest.raises(UserFunctionError, match="must return"):
        _call(lambda r, s: r)
    with pytest.raises(UserFunctionError, match="lacks columns"):
        _call(lambda r, s: (r, OUT.empty_table()))
    foreign = pa.table({"k": ["zzz"], "total": [1], "seen": [1]})
    with pytest.raises(UserFunctionError, match="key 'zzz'"):
        _call(lambda r, s: (foreign, OUT.empty_table()))


def test_fn_sees_rows_in_a_deterministic_order():
    seen = []

    def fn(rows, state):
        seen.append(rows.to_pylist())
        return STATE.empty_table(), OUT.empty_table()
    _call(fn, pa.table({"k": ["b", "a", "b"], "v": [3, 1, 2]}))
    _call(fn, pa.table({"k": ["b", "b", "a"], "v": [2, 3, 1]}))
    assert seen[0] == seen[1] == [{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "b", "v": 3}]


def test_the_null_key_is_one_key_with_its_own_state():
    """docs/operators.md "Null keys": rows with a null key reach fn together with the null key's state, and fn
    may keep state for it (as SQL GROUP BY); state for a null key without null-key input is still refused."""
    def null_safe_total(rows: pa.Table, state: pa.Table):  # a group-by, not a join: nulls group together
        g = rows.group_by("k", use_threads=False).aggregate([("v", "sum"), ("v", "count")]).rename_columns(
            ["k", "total", "seen"])
        new = pa.concat_tables([state, g.cast(STATE)]).group_by("k", use_threads=False).aggregate(
            [("total", "sum"), ("seen", "sum")]).rename_columns(["k", "total", "seen"]).cast(STATE)
        return new, pa.table({"k": new["k"], "total": new["total"], "first": pa.array([False] * new.num_rows)})

    state = STATE.append(pa.field(TOUCHED, pa.int64())).empty_table()
    for m, (ks, vs) in enumerate(((["a", None, None], [1, 2, 3]), ([None, "a"], [10, 20]))):
        r = process_step("p1", "k", null_safe_total, STATE, OUT, state, pa.table({"k": ks, "v": vs}),
                         barrier_us=m, ttl_us=None)
        state = r.state
    assert sorted(((s["k"], s["total"], s["seen"]) for s in state.to_pylist()), key=repr) == sorted(
        [("a", 21, 2), (None, 15, 3)], key=repr)
    null_state = pa.table({"k": pa.array([None], pa.string()), "total": [1], "seen": [1]})
    with pytest.raises(UserFunctionError, match="key None"):
        _call(lambda r, s: (null_state, OUT.empty_table()))
