"""Property test of the over aggregate kernel (``pipeline/operators/over_aggregate.py``) against a plain-Python
model: random epochs of rows (repeated keys, equal times, identical rows, out-of-order, late, null keys, times and
values) with a random non-decreasing watermark, split over subtasks (rescaled between epochs) and rounds. Per epoch:
the rows emitted with their aggregates, the late rows and the held rows, against "each on-time row whose time the
watermark has passed, with SQL's window over all on-time rows of its key" computed row by row (sharing no code with
Epochal)."""
from __future__ import annotations

import math
import zlib

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.operators.over_aggregate import FIRED, OverSpec, over_retract_step, over_step

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("k", pa.string()), ("t", pa.int64()), ("v", pa.int64()), ("f", pa.float64()),
                    ("s", pa.string())])
AGGS = (("n", "count", None), ("nv", "count", "v"), ("sv", "sum", "v"), ("av", "avg", "v"), ("sf", "sum", "f"),
        ("af", "avg", "f"), ("lo", "min", "s"), ("hi", "max", "v"))


def _table(rows):
    return pa.table({f.name: [r[i] for r in rows] for i, f in enumerate(SCHEMA)}, schema=SCHEMA)


def _sub(k, p):
    return 0 if k is None else zlib.crc32(k.encode()) % p


def _sort_key(r):
    k, t, v, f, s = r
    return (t, v is None, v or 0, f is None, f or 0.0, s is None, s or "")


def _agg(fn, vals):
    xs = [x for x in vals if x is not None]
    if fn == "count":
        return len(xs)
    if not xs:
        return None
    return {"min": min, "max": max}[fn](xs) if fn in ("min", "max") else (
        math.fsum(xs) if isinstance(xs[0], float) else sum(xs)) / (len(xs) if fn == "avg" else 1)


def model(epochs, wms, frame):
    """Per epoch (emitted rows with aggregates, late rows): SQL's window over the on-time rows."""
    on_time, late, out = [], [], []
    for m, rows in enumerate(epochs):
        w_prev = wms[m - 1] if m else None
        ok = [r for r in rows if r[0] is not None and r[1] is not None]
        on_time += [r for r in ok if w_prev is None or r[1] > w_prev]
        late.append(sorted((r for r in ok if w_prev is not None and r[1] <= w_prev), key=repr))
        emitted = []
        for k in {r[0] for r in on_time}:
            part = sorted((x for x in on_time if x[0] == k), key=_sort_key)
            for p, r in enumerate(part):   # fired in epoch m: W(m-1) < t <= W(m) (identical rows: the same epoch)
                if wms[m] is None or r[1] > wms[m] or (w_prev is not None and r[1] <= w_prev):
                    continue
                if frame[0] == "rows":
                    win = part[max(0, p - frame[1]):p + 1]
                else:
                    win = [x for x in part if r[1] - frame[1] <= x[1] <= r[1]]
                aggs = []
                for _, fn, col in AGGS:
                    vals = [1] * len(win) if col is None else [x["ktvfs".index(col)] for x in win]
                    aggs.append(_agg(fn, vals))
                emitted.append((*r, *aggs))
        out.append(sorted(emitted, key=repr))
    return out, late


def run_kernel(epochs, wms, frame, parallelisms, rounds):
    spec = OverSpec("k", "t", AGGS, rows=frame[1] if frame[0] == "rows" else None,
                    range_us=frame[1] if frame[0] == "range" else None)
    state = SCHEMA.append(pa.field(FIRED, pa.bool_())).empty_table()
    outs, lates = [], []
    for m, rows in enumerate(epochs):
        P, nr = parallelisms[m % len(parallelisms)], rounds[m % len(rounds)]
        w_prev = wms[m - 1] if m else None
        emitted, late, parts = [], [], []
        for i in range(P):
            cur = state.filter(pa.array([_sub(k, P) == i for k in state["k"].to_pylist()], pa.bool_()))
            mine = [r for r in rows if _sub(r[0], P) == i]
            for j in range(nr):
                res = over_step(spec, cur, _table(mine[len(mine) * j // nr:len(mine) * (j + 1) // nr]),
                                late_watermark_us=w_prev, watermark_us=wms[m], complete=(j == nr - 1))
                cur = res.state
                assert res.output.column_names == [*SCHEMA.names, *(a[0] for a in AGGS)]
                emitted += [tuple(r.values()) for r in res.output.to_pylist()]
                late += [tuple(r.values()) for r in res.late.to_pylist()]
                assert all(r["k"] is None or r["t"] is None for r in res.bad.to_pylist())
            parts.append(cur)
        state = pa.concat_tables(parts)
        outs.append(sorted(emitted, key=repr))
        lates.append(sorted(late, key=repr))
        # held: never a fired row the frame no longer needs
        if wms[m] is not None:
            for k in set(state["k"].to_pylist()):
                kf = [r for r in state.to_pylist() if r["k"] == k and r[FIRED]]
                if frame[0] == "rows":
                    assert len(kf) <= frame[1]
                else:
                    assert all(r["t"] > wms[m] - frame[1] for r in kf)
    return outs, lates


row = st.tuples(st.sampled_from(["a", "b", "c", None]), st.one_of(st.none(), st.integers(0, 30)),
                st.one_of(st.none(), st.integers(-5, 5)), st.one_of(st.none(), st.sampled_from([0.1, 0.2, 1e16, -3.5])),
                st.one_of(st.none(), st.sampled_from(["x", "y"])))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(epochs=st.lists(st.lists(row, max_size=12), min_size=1, max_size=5),
       steps=st.lists(st.one_of(st.none(), st.integers(0, 10)), min_size=5, max_size=5),
       frame=st.one_of(st.tuples(st.just("rows"), st.integers(0, 3)), st.tuples(st.just("range"), st.integers(0, 8))),
       parallelisms=st.lists(st.integers(1, 3), min_size=1, max_size=3),
       rounds=st.lists(st.integers(1, 3), min_size=1, max_size=3))
def test_over_kernel_matches_model(epochs, steps, frame, parallelisms, rounds):
    wms, w = [], None
    for s in steps[:len(epochs)]:
        if s is not None:
            w = s if w is None else w + s
        wms.append(w)
    want_out, want_late = model(epochs, wms, frame)
    got_out, got_late = run_kernel(epochs, wms, frame, parallelisms, rounds)
    assert got_late == want_late
    assert got_out == want_out


def test_range_peers_share_their_aggregate():
    spec = OverSpec("k", "t", (("n", "count", None),), range_us=0)
    rows = _table([("a", 5, 1, None, None), ("a", 5, 2, None, None), ("a", 6, 3, None, None)])
    res = over_step(spec, SCHEMA.append(pa.field(FIRED, pa.bool_())).empty_table(), rows,
                    late_watermark_us=None, watermark_us=10)
    assert sorted(zip(res.output["v"].to_pylist(), res.output["n"].to_pylist())) == [(1, 2), (2, 2), (3, 1)]


def test_spec_refuses_two_frames():
    with pytest.raises(ValueError, match="exactly one"):
        OverSpec("k", "t", (), rows=1, range_us=1)


# -- over an updating stream ----------------------------------------------------------------------------------------

USCHEMA = pa.schema([("u", pa.string()), ("k", pa.string()), ("t", pa.int64()), ("v", pa.int64())])
UAGGS = (("n", "count", None), ("sv", "sum", "v"), ("av", "avg", "v"), ("hi", "max", "v"))


def _umodel(current: dict, frame) -> dict:
    """Per upstream key: (its row, SQL's window aggregates) over the current rows (ties: u, then v)."""
    out = {}
    for k in {r[1] for r in current.values()}:
        part = sorted((r for r in current.values() if r[1] == k), key=lambda r: (r[2], r[0], r[3] is None, r[3] or 0))
        for p, r in enumerate(part):
            win = part[max(0, p - frame[1]):p + 1] if frame[0] == "rows" else [
                x for x in part if r[2] - frame[1] <= x[2] <= r[2]]
            vs = [x[3] for x in win]
            out[r[0]] = (*r, *[_agg(fn, [1] * len(win) if col is None else vs) for _, fn, col in UAGGS])
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds=st.lists(st.lists(st.tuples(st.sampled_from("pqrstuvw"), st.one_of(st.none(), st.tuples(
           st.sampled_from(["a", "b"]), st.integers(0, 6), st.one_of(st.none(), st.integers(-3, 3))))),
           max_size=6), min_size=1, max_size=6),
       frame=st.one_of(st.tuples(st.just("rows"), st.integers(0, 3)), st.tuples(st.just("range"), st.integers(0, 4))),
       parallelisms=st.lists(st.integers(1, 3), min_size=1, max_size=3))
def test_over_retract_kernel_matches_model(rounds, frame, parallelisms):
    """Rounds of upserts and deletes of upstream rows (``u``; a row may move to another partition ``k``, or vanish)
    as a retract changelog; an upsert sink keyed by ``u`` applying the output's changelog (retractions, then
    additions; a key only retracted is deleted) holds exactly SQL's window over the current rows, after every
    round, whatever the subtasks: no vanished row is left behind, and the rows after it are shifted."""
    spec = OverSpec("k", "t", UAGGS, rows=frame[1] if frame[0] == "rows" else None,
                    range_us=frame[1] if frame[0] == "range" else None)
    state = USCHEMA.append(pa.field(FIRED, pa.bool_())).empty_table()
    current: dict[str, tuple] = {}
    sink: dict[str, tuple] = {}
    for m, changes in enumerate(rounds):
        log = []
        for u, new in changes:
            if u in current:
                log.append((*current.pop(u), -1))
            if new is not None:
                current[u] = (u, *new)
                log.append((*current[u], 1))
        P = parallelisms[m % len(parallelisms)]
        parts = []
        added: list[tuple] = []
        retracted: list[tuple] = []
        for i in range(P):
            cur = state.filter(pa.array([_sub(k, P) == i for k in state["k"].to_pylist()], pa.bool_()))
            mine = [r for r in log if _sub(r[1], P) == i]
            chg = pa.table({**{f.name: [r[j] for r in mine] for j, f in enumerate(USCHEMA)},
                            "_sign": pa.array([r[4] for r in mine], pa.int32())},
                           schema=USCHEMA.append(pa.field("_sign", pa.int32())))
            res = over_retract_step(spec, cur, chg, "_sign")
            assert res.unmatched == 0 and not res.bad.num_rows
            added += [tuple(r.values()) for r in res.output.to_pylist()]
            retracted += [tuple(r.values()) for r in res.retracted.to_pylist()]
            untouched = cur.filter(pc.invert(pc.is_in(cur["k"], value_set=pa.array({r[1] for r in mine},
                                                                                    pa.string()))))
            parts += [untouched, res.state.select(cur.column_names).cast(cur.schema)]
        state = pa.concat_tables(parts)
        # the round's changelog, from every subtask, applied by an upsert sink keyed by u: a retraction takes back
        # exactly the row the sink holds; a key only retracted (its row vanished or moved away for good) is deleted
        assert len({r[0] for r in added}) == len(added)
        for r in retracted:
            assert sink.get(r[0]) == r
        for r in retracted:
            sink.pop(r[0])
        sink.update({r[0]: r for r in added})
        want = _umodel(current, frame)
        assert sink == want
        assert sorted(tuple(r.values())[:4] for r in state.to_pylist()) == sorted(current.values())


def test_over_retract_refuses_unknown_retraction():
    spec = OverSpec("k", "t", UAGGS, rows=1)
    chg = pa.table({"u": ["p"], "k": ["a"], "t": [1], "v": [2], "_sign": pa.array([-1], pa.int32())})
    res = over_retract_step(spec, USCHEMA.append(pa.field(FIRED, pa.bool_())).empty_table(), chg, "_sign")
    assert res.unmatched == 1


def test_over_retract_matches_a_row_with_nan():
    spec = OverSpec("k", "t", (("n", "count", "f"),), rows=1)
    sch = pa.schema([("k", pa.string()), ("t", pa.int64()), ("f", pa.float64()), ("_sign", pa.int32())])
    add = pa.table({"k": ["a", "a"], "t": [1, 2], "f": [float("nan"), 1.0], "_sign": [1, 1]}, schema=sch)
    res = over_retract_step(spec, sch.remove(3).append(pa.field(FIRED, pa.bool_())).empty_table(), add, "_sign")
    back = pa.table({"k": ["a"], "t": [1], "f": [float("nan")], "_sign": [-1]}, schema=sch)
    res = over_retract_step(spec, res.state, back, "_sign")
    assert res.unmatched == 0 and res.state["t"].to_pylist() == [2]
    assert res.output.to_pylist() == [{"k": "a", "t": 2, "f": 1.0, "n": 1}]


def test_over_retract_deletes_a_vanished_row_and_shifts_the_rows_after_it():
    """A top-N row pushed out (retracted, nothing added back): its last output is retracted (the sink deletes it),
    and the 2 rows after it, whose ROWS 2 frames held it, are retracted and added with their new sums."""
    spec = OverSpec("k", "t", (("sv", "sum", "v"),), rows=2)
    sch = USCHEMA.append(pa.field("_sign", pa.int32()))
    rows = [("p", "a", 1, 1), ("q", "a", 2, 10), ("r", "a", 3, 100), ("s", "a", 4, 1000), ("w", "a", 5, 10000)]
    add = pa.table({f.name: [r[i] for r in rows] for i, f in enumerate(USCHEMA)}
                   | {"_sign": pa.array([1] * 5, pa.int32())}, schema=sch)
    res = over_retract_step(spec, USCHEMA.append(pa.field(FIRED, pa.bool_())).empty_table(), add, "_sign")
    assert [r["sv"] for r in res.output.to_pylist()] == [1, 11, 111, 1110, 11100] and not res.retracted.num_rows
    gone = pa.table({"u": ["q"], "k": ["a"], "t": [2], "v": [10], "_sign": pa.array([-1], pa.int32())}, schema=sch)
    res = over_retract_step(spec, res.state, gone, "_sign")
    assert sorted((r["u"], r["sv"]) for r in res.retracted.to_pylist()) == [("q", 11), ("r", 111), ("s", 1110)]
    assert sorted((r["u"], r["sv"]) for r in res.output.to_pylist()) == [("r", 101), ("s", 1101)]
    assert sorted(res.state["u"].to_pylist()) == ["p", "r", "s", "w"]
    last = pa.table({"u": ["p", "r", "s", "w"], "k": ["a"] * 4, "t": [1, 3, 4, 5], "v": [1, 100, 1000, 10000],
                     "_sign": pa.array([-1] * 4, pa.int32())}, schema=sch)
    res = over_retract_step(spec, res.state, last, "_sign")     # the key empties: every row's output is retracted
    assert sorted(res.retracted["u"].to_pylist()) == ["p", "r", "s", "w"] and not res.output.num_rows
    assert not res.state.num_rows
