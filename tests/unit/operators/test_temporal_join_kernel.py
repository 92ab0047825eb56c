"""Property test of the temporal (versioned) join kernel (``pipeline/operators/temporal_join.py``) against a plain
Python model: random epochs of probe rows and versions (repeated keys, equal version times, out-of-order, late and
null times and keys) with a random non-decreasing watermark, split over subtasks (rescaled between epochs) and
rounds. Per epoch: the rows emitted with their version, the late rows and versions, and the held probe rows, against
"each on-time probe row whose time the watermark has passed, with the greatest on-time version at or before its
time" computed row by row (sharing no code with Epochal)."""
from __future__ import annotations

import zlib

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.operators.temporal_join import TemporalJoinSpec, temporal_join_step

pytestmark = pytest.mark.unit

LEFT = pa.schema([("k", pa.string()), ("lt", pa.int64()), ("lid", pa.int64())])
RIGHT = pa.schema([("k", pa.string()), ("vt", pa.int64()), ("_ingest_ts", pa.int64()), ("vid", pa.int64())])


def _table(rows, schema):
    return pa.table({f.name: [r[i] for r in rows] for i, f in enumerate(schema)}, schema=schema)


def _sub(k, p):
    return 0 if k is None else zlib.crc32(k.encode()) % p


def run_kernel(epochs, wms, how, parallelisms, rounds):
    spec = TemporalJoinSpec("k", "lt", "vt", how)
    sl, sr = LEFT.empty_table(), RIGHT.empty_table()
    out = []
    for m, (lrows, rrows) in enumerate(epochs):
        P, nr = parallelisms[m % len(parallelisms)], rounds[m % len(rounds)]
        w_prev = wms[m - 1] if m else None
        emitted, late, nl, nrr = [], [], [], []
        for i in range(P):
            cl = sl.filter(pa.array([_sub(k, P) == i for k in sl["k"].to_pylist()], pa.bool_()))
            cr = sr.filter(pa.array([_sub(k, P) == i for k in sr["k"].to_pylist()], pa.bool_()))
            ml = [r for r in lrows if _sub(r[0], P) == i]
            mr = [r for r in rrows if _sub(r[0], P) == i]
            for j in range(nr):
                res = temporal_join_step(
                    spec, cl, cr, _table(ml[len(ml) * j // nr:len(ml) * (j + 1) // nr], LEFT),
                    _table(mr[len(mr) * j // nr:len(mr) * (j + 1) // nr], RIGHT),
                    late_watermark_us=w_prev, watermark_us=wms[m], complete=(j == nr - 1))
                cl, cr = res.left, res.right
                assert res.output.column_names == ["k", "lt", "lid", "vt", "vid"]
                emitted += list(zip(res.output["lid"].to_pylist(), res.output["vid"].to_pylist()))
                late += [("l", x) for x in res.late_left["lid"].to_pylist()]
                late += [("r", x) for x in res.late_right["vid"].to_pylist()]
                bad = res.bad_left["lid"].to_pylist() + res.bad_right["vid"].to_pylist()
                assert all(r[0] is None or r[1] is None for r in ml + mr if r[-1] in bad)
            nl.append(cl)
            nrr.append(cr)
        sl, sr = pa.concat_tables(nl), pa.concat_tables(nrr)
        out.append((sorted(emitted, key=repr), sorted(late), sorted(sl["lid"].to_pylist()), sr))
    return out


def model(epochs, wms, how):
    """Row by row: the on-time rows (W(m-1) of their epoch), the probe rows emitted in epoch m (first epoch whose
    W(m) has passed their time), each with the greatest (vt, ingest, vid) on-time version of its key at or before
    its time, among every version seen so far."""
    out = []
    for m in range(len(epochs)):
        def on_time(side, m=m):
            rows, late = [], []
            for e in range(m + 1):
                for r in epochs[e][side]:
                    if r[0] is None or r[1] is None:
                        continue
                    (late if e and wms[e - 1] is not None and r[1] <= wms[e - 1] else rows).append((e, r))
            return rows, late
        lo, ll = on_time(0)
        vo, vl = on_time(1)
        emitted = []

        def emit_epoch(e, t):   # the first epoch >= e whose watermark passed t (None: not yet)
            return next((x for x in range(e, m + 1) if wms[x] is not None and t <= wms[x]), None)  # noqa: B023
        for e, (k, t, lid) in lo:
            if emit_epoch(e, t) != m:
                continue
            cands = [(vt, ing, vid) for _e, (vk, vt, ing, vid) in vo if vk == k and vt <= t]
            if cands:
                emitted.append((lid, max(cands)[2]))
            elif how == "left":
                emitted.append((lid, None))
        late = sorted([("l", r[2]) for e, r in ll if e == m] + [("r", r[3]) for e, r in vl if e == m])
        held = sorted(lid for e, (k, t, lid) in lo if emit_epoch(e, t) is None)
        out.append((sorted(emitted, key=repr), late, held, vo))
    return out


@st.composite
def workloads(draw):
    keys = draw(st.lists(st.sampled_from(list("abcd")), min_size=1, max_size=4, unique=True))
    n = draw(st.integers(1, 6))
    epochs, wms, w, rid = [], [], None, 0
    for m in range(n):
        sides = []
        for side in range(2):
            rows = []
            for _ in range(draw(st.integers(0, 10))):
                k = None if draw(st.integers(0, 20)) == 0 else draw(st.sampled_from(keys))
                t = None if draw(st.integers(0, 20)) == 0 else m * 10 + draw(st.integers(-25, 10))
                if side == 0:
                    rows.append((k, t, rid))
                else:   # equal version times and ingest times happen: the order's later columns decide
                    rows.append((k, t, m * 10 + draw(st.integers(0, 2)), rid))
                rid += 1
            sides.append(rows)
        epochs.append(tuple(sides))
        step = draw(st.one_of(st.none(), st.integers(0, 15)))
        if step is not None:
            w = (m * 10 - 10 + step) if w is None else max(w, m * 10 - 10 + step)
        wms.append(w)
    return epochs, wms, draw(st.sampled_from(["inner", "left"])), \
        draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)), draw(st.lists(st.integers(1, 3), min_size=1,
                                                                                  max_size=2))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(workloads())
def test_temporal_join_step_matches_the_model(w):
    epochs, wms, how, parallelisms, rounds = w
    for m, (exp, act) in enumerate(zip(model(epochs, wms, how), run_kernel(epochs, wms, how, parallelisms, rounds))):
        assert act[1] == exp[1], f"epoch {m}: late rows"
        assert act[0] == exp[0], f"epoch {m}: emitted rows"
        assert act[2] == exp[2], f"epoch {m}: held probe rows"
        # the versions held: every on-time version a later on-time probe row (t > W(m)) could still need
        held = set(act[3]["vid"].to_pylist())
        wm = wms[m]
        need = set()
        for _e, (_k, vt, _ing, vid) in exp[3]:
            if wm is None or vt > wm:
                need.add(vid)
        for k in {r[0] for _e, r in exp[3]}:
            passed = [(vt, ing, vid) for _e, (vk, vt, ing, vid) in exp[3] if vk == k and wm is not None and vt <= wm]
            if passed:
                need.add(max(passed)[2])
        assert held == need, f"epoch {m}: versions held"


def test_late_version_is_apart_and_never_applied():
    spec = TemporalJoinSpec("k", "lt", "vt")
    v1 = _table([("a", 0, 0, 1)], RIGHT)
    r = temporal_join_step(spec, LEFT.empty_table(), RIGHT.empty_table(), LEFT.empty_table(), v1,
                           late_watermark_us=None, watermark_us=10)
    # epoch 2: a version at 5 (behind W = 10) arrives with a probe row at 12: the row gets version 1
    r = temporal_join_step(spec, r.left, r.right, _table([("a", 12, 7)], LEFT), _table([("a", 5, 11, 2)], RIGHT),
                           late_watermark_us=10, watermark_us=20)
    assert r.late_right["vid"].to_pylist() == [2]
    assert list(zip(r.output["lid"].to_pylist(), r.output["vid"].to_pylist())) == [(7, 1)]
