"""Property test of the retracting join kernel (``pipeline.operators.retract_join``) against a plain-Python model:
two signed multisets (left rows, right rows), their inner equi-join (null keys match nothing) after every round.

Left is an append stream (Nexmark q5's per-window counts); right is the changelog of a running aggregate (a per-key
maximum that rises: its previous row retracted, its new one added). The rounds' rows are shuffled and split over 1-3
subtasks by key group, the parallelism changing between rounds (a rescale), the state read whole (heap) or for the
round's keys only (RocksDB). The sum of the emitted changelog equals the model's join at every round, and an upsert
sink of the filtered result (``num >= maxn``: q5) equals the model's filtered join."""
from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.operators.retract import KG, SIGN
from pipeline.operators.retract_join import MULT, retract_join_step, state_schema
from pipeline.runtime.operators.sink_writer import from_changelog, merge_prior
from pipeline.sink.deletes import live_rows

pytestmark = pytest.mark.unit

MP = 8
LEFT = pa.schema([("w", pa.int64()), ("auction", pa.string()), ("num", pa.int64())])
RIGHT = pa.schema([("w", pa.int64()), ("maxn", pa.int64())])
OUTPUT = (("w", "l"), ("auction", "l"), ("num", "l"), ("maxn", "r"))
OUT_SCHEMA = pa.schema([("w", pa.int64()), ("auction", pa.string()), ("num", pa.int64()), ("maxn", pa.int64())])


def _kg(w):
    return 0 if w is None else w % MP


def _with_kg(rows: list[dict], schema: pa.Schema, signed: bool) -> pa.Table:
    t = pa.Table.from_pylist(rows, schema=schema.append(pa.field(SIGN, pa.int32())) if signed else schema)
    return t.append_column(KG, pa.array([_kg(r["w"]) for r in rows], pa.int32()))


def _split(rows: list[dict], p: int) -> list[list[dict]]:
    out: list[list[dict]] = [[] for _ in range(p)]
    for r in rows:   # the subtask whose key-group range [MP*i//p, MP*(i+1)//p) holds the row's key group
        out[next(i for i in range(p) if MP * i // p <= _kg(r["w"]) < MP * (i + 1) // p)].append(r)
    return out


def _model_join(left: Counter, right: Counter) -> Counter:
    out: Counter = Counter()
    for (w, a, n), ml in left.items():
        for (w2, m), mr in right.items():
            if w is not None and w == w2:
                out[(w, a, n, m)] += ml * mr
    return +out


round_st = st.lists(st.tuples(st.sampled_from([None, 0, 1, 2, 3, 9, 17]), st.sampled_from(["a", "b", "c", None]),
                              st.integers(0, 6)), max_size=8)


@settings(max_examples=120, deadline=None)
@given(rounds=st.lists(round_st, min_size=1, max_size=6), seed=st.integers(0, 10_000),
       per_key=st.booleans())
def test_retracting_join_equals_the_model(rounds, seed, per_key):
    rng = random.Random(seed)
    ls, rs = state_schema(LEFT), state_schema(RIGHT)
    left_state, right_state = ls.empty_table(), rs.empty_table()
    model_l: Counter = Counter()
    maxn: dict = {}                       # the upstream running aggregate: max(num) per window
    emitted: Counter = Counter()
    sink = pa.schema(list(OUT_SCHEMA) + [pa.field("_deleted", pa.bool_())]).empty_table()
    for rnd in rounds:
        lrows = [{"w": w, "auction": a, "num": n} for w, a, n in rnd]
        rrows = []
        for w, _a, n in rnd:   # the max per window rises: retract the old row, add the new one (as a changelog)
            if w is None:
                continue
            old = maxn.get(w)
            if old is None or n > old:
                if old is not None:
                    rrows.append({"w": w, "maxn": old, SIGN: -1})
                rrows.append({"w": w, "maxn": n, SIGN: 1})
                maxn[w] = n
        # consolidate the upstream's round (an aggregate emits one retraction and one addition per changed key)
        net: Counter = Counter()
        for r in rrows:
            net[(r["w"], r["maxn"])] += r[SIGN]
        rrows = [{"w": w, "maxn": m, SIGN: 1 if c > 0 else -1} for (w, m), c in net.items() for _ in range(abs(c))]
        rng.shuffle(lrows)
        rng.shuffle(rrows)
        for r in lrows:
            model_l[(r["w"], r["auction"], r["num"])] += 1
        p = rng.randint(1, 3)
        outs = []
        new_l, new_r = [], []
        used_l = pa.array([False] * left_state.num_rows, pa.bool_())
        used_r = pa.array([False] * right_state.num_rows, pa.bool_())
        for i, (lpart, rpart) in enumerate(zip(_split(lrows, p), _split(rrows, p))):
            lt, rt = _with_kg(lpart, LEFT, False), _with_kg(rpart, RIGHT, True)
            if per_key:   # RocksDB: the held rows of the round's keys only (the others come back untouched)
                keys = pa.array(sorted({r["w"] for r in lpart + rpart if r["w"] is not None}), pa.int64())
                ml = pc.is_in(left_state["w"], value_set=keys)
                mr = pc.is_in(right_state["w"], value_set=keys)
            else:         # heap: the subtask's whole key-group range
                lo, hi = MP * i // p, MP * (i + 1) // p
                ml = pc.and_(pc.greater_equal(left_state[KG], lo), pc.less(left_state[KG], hi))
                mr = pc.and_(pc.greater_equal(right_state[KG], lo), pc.less(right_state[KG], hi))
            ml, mr = pc.fill_null(ml, False), pc.fill_null(mr, False)
            used_l, used_r = pc.or_(used_l, ml), pc.or_(used_r, mr)
            step = retract_join_step("w", OUTPUT, LEFT, RIGHT, left_state.filter(ml), right_state.filter(mr), lt, rt)
            new_l.append(step.left)
            new_r.append(step.right)
            outs.append(step.changelog)
        new_l.append(left_state.filter(pc.invert(used_l)))
        new_r.append(right_state.filter(pc.invert(used_r)))
        left_state, right_state = pa.concat_tables(new_l), pa.concat_tables(new_r)
        assert pc.all(pc.greater(left_state[MULT], 0)).as_py() in (True, None)
        round_change: Counter = Counter()
        for c in outs:
            for r in ([] if c is None else c.to_pylist()):
                round_change[(r["w"], r["auction"], r["num"], r["maxn"])] += r[SIGN]
        emitted.update(round_change)
        emitted = +emitted if all(v >= 0 for v in emitted.values()) else emitted
        model_r = Counter({(w, m): 1 for w, m in maxn.items()})
        want = _model_join(model_l, model_r)
        assert {k: v for k, v in emitted.items() if v} == dict(want)
        # the state is the model's multisets
        assert Counter({(r["w"], r["auction"], r["num"]): r[MULT] for r in left_state.to_pylist()}) == +Counter(
            {k: v for k, v in model_l.items() if k[0] is not None})
        # q5: the filtered result (num >= maxn) in an upsert sink keyed by (w, auction, num): one live row per key
        flow = [c.filter(pc.greater_equal(c["num"], c["maxn"])) for c in outs if c is not None]
        if flow:
            rows = pa.concat_tables(flow)
            if rows.num_rows:
                sink = merge_prior(sink, from_changelog(rows, OUT_SCHEMA, ["w", "auction", "num"], ()),
                                   ["w", "auction", "num"])
        got = sorted((tuple(r.values()) for r in live_rows(sink).to_pylist()), key=repr)
        assert got == sorted((k for k in want if k[2] >= k[3]), key=repr)


def test_a_retraction_of_a_row_never_added_is_refused():
    ls, rs = state_schema(LEFT), state_schema(RIGHT)
    rows = _with_kg([{"w": 1, "maxn": 3, SIGN: -1}], RIGHT, True)
    with pytest.raises(RuntimeError, match="right input retracted a row it never added"):
        retract_join_step("w", OUTPUT, LEFT, RIGHT, ls.empty_table(), rs.empty_table(), None, rows)


def test_a_pair_retracted_and_added_in_one_round_emits_nothing():
    ls, rs = state_schema(LEFT), state_schema(RIGHT)
    first = retract_join_step("w", OUTPUT, LEFT, RIGHT, ls.empty_table(), rs.empty_table(),
                              _with_kg([{"w": 1, "auction": "a", "num": 2}], LEFT, False),
                              _with_kg([{"w": 1, "maxn": 2, SIGN: 1}], RIGHT, True))
    assert first.changelog.to_pylist() == [{"w": 1, "auction": "a", "num": 2, "maxn": 2, SIGN: 1}]
    again = retract_join_step("w", OUTPUT, LEFT, RIGHT, first.left, first.right, None,
                              _with_kg([{"w": 1, "maxn": 2, SIGN: -1}, {"w": 1, "maxn": 2, SIGN: 1}], RIGHT, True))
    assert again.changelog is None
    rises = retract_join_step("w", OUTPUT, LEFT, RIGHT, first.left, first.right, None,
                              _with_kg([{"w": 1, "maxn": 2, SIGN: -1}, {"w": 1, "maxn": 5, SIGN: 1}], RIGHT, True))
    assert rises.changelog.to_pylist() == [{"w": 1, "auction": "a", "num": 2, "maxn": 2, SIGN: -1},
                                           {"w": 1, "auction": "a", "num": 2, "maxn": 5, SIGN: 1}]
