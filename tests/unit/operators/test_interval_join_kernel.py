"""Property test of the interval join kernel (``pipeline/operators/interval_join.py``) against a pandas model: random
epochs of left and right rows (repeated keys, out-of-order and late times, null keys and times, negative and positive
bounds) with a random non-decreasing watermark, split over subtasks (rescaled between epochs) and rounds, for every
join type. Per epoch: the pairs emitted (an outer side's unmatched rows with ``-1`` for the other side, in the epoch
whose watermark releases them), the late rows, the state and its ``_matched`` flags, against the (outer) interval
join of the on-time rows (pandas ``merge``, sharing no code with Epochal)."""
from __future__ import annotations

import zlib

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.operators.interval_join import JOIN_TYPES, MATCHED, IntervalJoinSpec, interval_join_step, state_schema

pytestmark = pytest.mark.unit

LEFT = pa.schema([("k", pa.string()), ("lt", pa.int64()), ("lid", pa.int64())])
RIGHT = pa.schema([("k", pa.string()), ("rt", pa.int64()), ("rid", pa.int64())])


def _table(rows, schema):
    return pa.table({f.name: [r[i] for r in rows] for i, f in enumerate(schema)}, schema=schema)


def _sub(k, p):
    return 0 if k is None else zlib.crc32(k.encode()) % p


def _ids(t: pa.Table, col: str) -> list[int]:
    return [-1 if x is None else x for x in t[col].to_pylist()]


def _matched(t: pa.Table, col: str) -> list[int]:
    return sorted(i for i, m in zip(t[col].to_pylist(), t[MATCHED].to_pylist()) if m) if MATCHED in t.column_names \
        else []


def run_kernel(epochs, wms, lower, upper, parallelisms, rounds, how="inner"):
    spec = IntervalJoinSpec("k", "lt", "rt", lower, upper, how=how)
    sl, sr = state_schema(spec, LEFT, "left").empty_table(), state_schema(spec, RIGHT, "right").empty_table()
    out = []
    for m, (lrows, rrows) in enumerate(epochs):
        P, nr = parallelisms[m % len(parallelisms)], rounds[m % len(rounds)]
        w_prev = wms[m - 1] if m else None
        pairs, late, nl, nrr = [], [], [], []
        for i in range(P):
            cl = sl.filter(pa.array([_sub(k, P) == i for k in sl["k"].to_pylist()], pa.bool_()))
            cr = sr.filter(pa.array([_sub(k, P) == i for k in sr["k"].to_pylist()], pa.bool_()))
            ml = [r for r in lrows if _sub(r[0], P) == i]
            mr = [r for r in rrows if _sub(r[0], P) == i]
            for j in range(nr):
                res = interval_join_step(
                    spec, cl, cr, _table(ml[len(ml) * j // nr:len(ml) * (j + 1) // nr], LEFT),
                    _table(mr[len(mr) * j // nr:len(mr) * (j + 1) // nr], RIGHT),
                    late_watermark_us=w_prev, watermark_us=wms[m], complete=(j == nr - 1))
                cl, cr = res.left, res.right
                pairs += list(zip(_ids(res.output, "lid"), _ids(res.output, "rid")))
                late += [("l", x) for x in res.late_left["lid"].to_pylist()]
                late += [("r", x) for x in res.late_right["rid"].to_pylist()]
            nl.append(cl)
            nrr.append(cr)
        sl, sr = pa.concat_tables(nl), pa.concat_tables(nrr)
        out.append((sorted(pairs), sorted(late), sorted(sl["lid"].to_pylist()), sorted(sr["rid"].to_pylist()),
                    _matched(sl, "lid"), _matched(sr, "rid")))
    return out


def _released(t, shift, m_row, wms):
    """The epoch whose watermark releases a held row at time ``t`` (``t + shift <= W``), not before its own."""
    return next((e for e in range(m_row, len(wms)) if wms[e] is not None and t + shift <= wms[e]), None)


def model(epochs, wms, lower, upper, how="inner"):
    L = pd.DataFrame([(m, *r) for m, (ls, _) in enumerate(epochs) for r in ls], columns=["m", "k", "lt", "lid"])
    R = pd.DataFrame([(m, *r) for m, (_, rs) in enumerate(epochs) for r in rs], columns=["m", "k", "rt", "rid"])
    out = []
    for m in range(len(epochs)):
        def on_time(df, t, m=m):
            df = df[(df.m <= m) & df.k.notna() & df[t].notna()]
            prev = [wms[e - 1] if e else None for e in df.m]   # W(m-1) of each row's epoch (None: -inf)
            keep = pd.Series([p is None or x > p for x, p in zip(df[t], prev)], index=df.index, dtype=bool)
            return df[keep], df[~keep]
        lo, ll = on_time(L, "lt")
        ro, rl = on_time(R, "rt")
        j = lo.merge(ro, on="k", suffixes=("_l", "_r"))
        j = j[(j["rt"] >= j["lt"] + lower) & (j["rt"] <= j["lt"] + upper)]
        paired_l, paired_r = set(map(int, j.lid)), set(map(int, j.rid))
        j = j[j[["m_l", "m_r"]].max(axis=1) == m]
        pairs = [(int(a), int(b)) for a, b in zip(j.lid, j.rid)]
        if how in ("left", "full"):
            pairs += [(int(i), -1) for i, t, e in zip(lo["lid"], lo["lt"], lo["m"])
                      if int(i) not in paired_l and _released(t, upper, e, wms) == m]
        if how in ("right", "full"):
            pairs += [(-1, int(i)) for i, t, e in zip(ro["rid"], ro["rt"], ro["m"])
                      if int(i) not in paired_r and _released(t, -lower, e, wms) == m]
        late = sorted([("l", int(x)) for x in ll[ll.m == m].lid] + [("r", int(x)) for x in rl[rl.m == m].rid])
        w = wms[m]
        held_l = sorted(int(x) for x in lo[lo["lt"] + upper > w].lid) if w is not None else sorted(map(int, lo.lid))
        held_r = sorted(int(x) for x in ro[ro["rt"] - lower > w].rid) if w is not None else sorted(map(int, ro.rid))
        out.append((sorted(pairs), late, held_l, held_r,
                    sorted(i for i in held_l if i in paired_l) if how in ("left", "full") else [],
                    sorted(i for i in held_r if i in paired_r) if how in ("right", "full") else []))
    return out


@st.composite
def workloads(draw):
    lower = draw(st.integers(-10, 5))
    upper = lower + draw(st.integers(0, 12))
    keys = draw(st.lists(st.sampled_from(list("abcd")), min_size=1, max_size=4, unique=True))
    n = draw(st.integers(1, 6))
    epochs, wms, w, rid = [], [], None, 0
    for m in range(n):
        sides = []
        for _ in range(2):
            rows = []
            for _ in range(draw(st.integers(0, 10))):
                k = None if draw(st.integers(0, 20)) == 0 else draw(st.sampled_from(keys))
                t = None if draw(st.integers(0, 20)) == 0 else m * 10 + draw(st.integers(-25, 10))
                rows.append((k, t, rid))
                rid += 1
            sides.append(rows)
        epochs.append(tuple(sides))
        step = draw(st.one_of(st.none(), st.integers(0, 15)))
        if step is not None:
            w = (m * 10 - 10 + step) if w is None else max(w, m * 10 - 10 + step)
        wms.append(w)
    return epochs, wms, lower, upper, draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)), \
        draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)), draw(st.sampled_from(JOIN_TYPES))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(workloads())
def test_interval_join_step_matches_the_model(w):
    epochs, wms, lower, upper, parallelisms, rounds, how = w
    for m, (exp, act) in enumerate(zip(model(epochs, wms, lower, upper, how),
                                       run_kernel(epochs, wms, lower, upper, parallelisms, rounds, how))):
        assert act[1] == exp[1], f"epoch {m}: late rows"
        assert act[0] == exp[0], f"epoch {m} ({how}): pairs"
        assert act[2] == exp[2], f"epoch {m}: left state"
        assert act[3] == exp[3], f"epoch {m}: right state"
        assert act[4:] == exp[4:], f"epoch {m} ({how}): matched flags"


def test_an_outer_join_emits_a_released_unmatched_row_once_with_nulls():
    spec = IntervalJoinSpec("k", "lt", "rt", 0, 5, how="full")
    sl, sr = state_schema(spec, LEFT, "left").empty_table(), state_schema(spec, RIGHT, "right").empty_table()
    res = interval_join_step(spec, sl, sr, _table([("a", 10, 1), ("b", 10, 2)], LEFT), _table([("a", 12, 7)], RIGHT),
                             late_watermark_us=None, watermark_us=11)
    assert res.output.to_pylist() == [{"k": "a", "lt": 10, "lid": 1, "rt": 12, "rid": 7}]
    assert res.left[MATCHED].to_pylist() == [True, False] and res.right[MATCHED].to_pylist() == [True]
    assert res.output.schema.field("rid").nullable and res.output.schema.field("lid").nullable
    res = interval_join_step(spec, res.left, res.right, LEFT.empty_table(), RIGHT.empty_table(),
                             late_watermark_us=11, watermark_us=20)
    assert sorted(res.output.to_pylist(), key=lambda r: r["k"]) == [
        {"k": "b", "lt": 10, "lid": 2, "rt": None, "rid": None}]   # "a" was matched: released silently
    assert res.left.num_rows == 0 and res.right.num_rows == 0
    with pytest.raises(ValueError, match="how='outer'"):
        IntervalJoinSpec("k", "lt", "rt", 0, 5, how="outer")
