"""Property tests of the join kernel against a brute-force model (pure pyarrow, no Spark).

Random rows with repeated keys on both sides arrive over many epochs, each epoch split into a random number
of rounds (backlog), and key groups split over subtasks (some empty). The model states the semantics
declaratively (docs/operators.md): a pair (l, r) is emitted iff keys are equal and
``min(t_l, t_r) >= end(max(e(l), e(r))) - ttl``; an outer row that never paired is emitted with nulls in the
first processed epoch m whose cutoff ``end(m) - ttl`` passes it.
"""
from __future__ import annotations

import itertools
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.operators.join import MATCHED, JoinType, Uniqueness, join_step

pytestmark = pytest.mark.unit

E = 10  # epoch length (us, small numbers keep the model readable)
TS = pa.timestamp("us", tz="UTC")
LEFT = pa.schema([("k", pa.string()), ("lv", pa.int64()), ("_ingest_ts", TS)])
RIGHT = pa.schema([("k", pa.string()), ("rv", pa.int64()), ("_ingest_ts", TS)])
OUT = pa.schema([("k", pa.string()), ("lv", pa.int64()), ("rv", pa.int64())])


def end(m: int) -> int:
    return (m + 1) * E


# keys repeat on both sides; None is a null key (SQL: it equals nothing, never a pair, never a violation)
rows_st = st.lists(st.tuples(st.sampled_from(list("abcdefg") + [None]), st.integers(0, 79)), max_size=40)


def _table(rows, schema, val_name, start_id):
    return pa.table({"k": [k for k, _, _ in rows], val_name: [i for _, _, i in rows],
                     "_ingest_ts": pa.array([t for _, t, _ in rows], TS)}, schema=schema)


def _with_ids(rows, start):
    return [(k, t, start + i) for i, (k, t) in enumerate(rows)]


def run_kernel(lrows, rrows, *, ttl, how, unique, n_epochs, rounds, subtasks):
    """Feed rows epoch by epoch (rows of epoch m in ``rounds[m]`` rounds), keys hashed over subtasks."""
    out, bad_l, bad_r = [], [], []
    state = {s: (LEFT.append(pa.field(MATCHED, pa.bool_())).empty_table(),
                 RIGHT.append(pa.field(MATCHED, pa.bool_())).empty_table()) for s in range(subtasks)}
    sub = {k: (ord(k) * 7) % subtasks for k in "abcdefg"} | {None: subtasks - 1}
    for m in range(n_epochs):
        cutoff = pa.scalar(end(m) - ttl, TS) if ttl is not None else None
        el = [r for r in lrows if r[1] // E == m]
        er = [r for r in rrows if r[1] // E == m]
        k = rounds[m % len(rounds)]
        for rnd in range(k):
            part_l = el[rnd * len(el) // k:(rnd + 1) * len(el) // k]
            part_r = er[rnd * len(er) // k:(rnd + 1) * len(er) // k]
            for s in range(subtasks):
                nl = _table([r for r in part_l if sub[r[0]] == s], LEFT, "lv", 0)
                nr = _table([r for r in part_r if sub[r[0]] == s], RIGHT, "rv", 0)
                res = join_step(state[s][0], state[s][1], nl, nr, key="k", cutoff=cutoff, how=how, unique=unique,
                                output_schema=OUT)
                state[s] = (res.left, res.right)
                out.extend(tuple(r.values()) for r in res.output.to_pylist())
                bad_l.extend(res.violations_left["lv"].to_pylist())
                bad_r.extend(res.violations_right["rv"].to_pylist())
    return out, bad_l, bad_r, state


def model(lrows, rrows, *, ttl, how, n_epochs):
    def e(t):
        return t // E
    pairs = []
    paired_l, paired_r = set(), set()
    for (kl, tl, il), (kr, tr, ir) in itertools.product(lrows, rrows):
        if kl is not None and kl == kr and (ttl is None or min(tl, tr) >= end(max(e(tl), e(tr))) - ttl):
            pairs.append((kl, il, ir))
            paired_l.add(il)
            paired_r.add(ir)
    out = list(pairs)

    def expires(t):  # some processed epoch m >= e(t) has end(m) - ttl > t
        return ttl is not None and any(end(m) - ttl > t for m in range(e(t), n_epochs))
    if how in (JoinType.LEFT, JoinType.FULL):
        out += [(k, i, None) for k, t, i in lrows if i not in paired_l and expires(t)]
    if how in (JoinType.RIGHT, JoinType.FULL):
        out += [(k, None, i) for k, t, i in rrows if i not in paired_r and expires(t)]
    return out


common = dict(ttl=st.one_of(st.none(), st.integers(0, 45)), n_epochs=st.integers(1, 9),
              rounds=st.lists(st.integers(1, 3), min_size=1, max_size=4), subtasks=st.integers(1, 3))


@settings(max_examples=60, deadline=None)
@given(l=rows_st, r=rows_st, how=st.sampled_from(list(JoinType)), **common)
def test_join_matches_model(l, r, how, ttl, n_epochs, rounds, subtasks):
    lrows, rrows = _with_ids(l, 0), _with_ids(r, 1000)
    lrows = [x for x in lrows if x[1] // E < n_epochs]
    rrows = [x for x in rrows if x[1] // E < n_epochs]
    got, bad_l, bad_r, _ = run_kernel(lrows, rrows, ttl=ttl, how=how, unique=Uniqueness.NONE, n_epochs=n_epochs,
                                      rounds=rounds, subtasks=subtasks)
    assert not bad_l and not bad_r
    assert Counter(got) == Counter(model(lrows, rrows, ttl=ttl, how=how, n_epochs=n_epochs))


def _unique_rows(rows):
    seen, out = set(), []
    for k, t in rows:
        if k is None or k not in seen:  # null keys never repeat a key
            seen.add(k)
            out.append((k, t))
    return out


@settings(max_examples=60, deadline=None)
@given(l=rows_st, r=rows_st, how=st.sampled_from(list(JoinType)), unique=st.sampled_from(list(Uniqueness)), **common)
def test_declared_unique_on_unique_data_equals_model(l, r, how, unique, ttl, n_epochs, rounds, subtasks):
    """When the declaration holds, declaring it changes nothing in the output (state is only smaller)."""
    if unique.left:
        l = _unique_rows(l)
    if unique.right:
        r = _unique_rows(r)
    lrows = [x for x in _with_ids(l, 0) if x[1] // E < n_epochs]
    rrows = [x for x in _with_ids(r, 1000) if x[1] // E < n_epochs]
    got, bad_l, bad_r, state = run_kernel(lrows, rrows, ttl=ttl, how=how, unique=unique, n_epochs=n_epochs,
                                          rounds=rounds, subtasks=subtasks)
    assert not bad_l and not bad_r
    assert Counter(got) == Counter(model(lrows, rrows, ttl=ttl, how=how, n_epochs=n_epochs))
    if unique.left:  # matched right rows left state
        for _, rs in state.values():
            assert not any(rs[MATCHED].to_pylist())


@settings(max_examples=60, deadline=None)
@given(l=rows_st, r=rows_st, unique=st.sampled_from([Uniqueness.LEFT, Uniqueness.RIGHT, Uniqueness.BOTH]),
       **common)
def test_violations_are_never_lost_nor_double_counted(l, r, unique, ttl, n_epochs, rounds, subtasks):
    lrows = [x for x in _with_ids(l, 0) if x[1] // E < n_epochs]
    rrows = [x for x in _with_ids(r, 1000) if x[1] // E < n_epochs]
    got, bad_l, bad_r, _ = run_kernel(lrows, rrows, ttl=ttl, how=JoinType.FULL, unique=unique,
                                      n_epochs=n_epochs, rounds=rounds, subtasks=subtasks)
    # no pair twice, every pair a true pair of the full data, no violating row in the output
    pairs = [g for g in got if g[1] is not None and g[2] is not None]
    assert len(pairs) == len(set(pairs))
    truth = set(model(lrows, rrows, ttl=ttl, how=JoinType.INNER, n_epochs=n_epochs))
    assert set(pairs) <= truth
    assert not {g[1] for g in got} & set(bad_l) and not {g[2] for g in got} & set(bad_r)
    # a null key is no key: it never violates a declaration (and never pairs)
    assert not {i for k, _, i in lrows if k is None} & set(bad_l)
    assert not {i for k, _, i in rrows if k is None} & set(bad_r)
    assert all(g[0] is not None for g in pairs)
    # a unique side's kept rows never hold one key twice in the same epoch (processed in one round)
    # (a row already past the TTL cutoff of its own epoch never enters state: it is emitted as expired at once
    # and cannot clash with anything, so only rows alive on arrival are checked)
    def alive(t):
        return ttl is None or t >= end(t // E) - ttl

    if unique.left and set(rounds) == {1}:
        kept = Counter((k, t // E) for k, t, i in lrows if i not in set(bad_l) and alive(t) and k is not None)
        assert all(v == 1 for v in kept.values())
        # violations: exactly the rows repeating a key within an epoch or while the first is held
        assert len(bad_l) >= sum(v - 1 for v in Counter((k, t // E) for k, t, _ in lrows
                                                        if alive(t) and k is not None).values())
    if not unique.left:
        assert not bad_l
    if not unique.right:
        assert not bad_r


def test_many_to_many_example():
    l = [("a", 1), ("a", 2), ("b", 3)]
    r = [("a", 15), ("a", 25), ("b", 4)]
    lrows, rrows = _with_ids(l, 0), _with_ids(r, 1000)
    got, _, _, _ = run_kernel(lrows, rrows, ttl=None, how=JoinType.INNER, unique=Uniqueness.NONE, n_epochs=3,
                              rounds=[1], subtasks=1)
    assert sorted(got) == sorted([("a", 0, 1000), ("a", 0, 1001), ("a", 1, 1000), ("a", 1, 1001), ("b", 2, 1002)])


def test_output_with_ingest_ts_carries_the_later_of_the_pair():
    """``output=`` naming ``_ingest_ts`` (what a deduplicate after the join needs): a pair's is the later of its two
    rows' (docs/operators.md "Column layout"); a lonely outer row keeps its own. (Timestamps have no arrow maximum
    kernel: this used to raise ``ArrowNotImplementedError`` for every such join.)"""
    ts = pa.timestamp("us", tz="UTC")
    ls = pa.schema([("k", pa.string()), ("x", pa.int64()), ("_ingest_ts", ts)])
    rs = pa.schema([("k", pa.string()), ("y", pa.int64()), ("_ingest_ts", ts)])
    out_schema = pa.schema([("k", pa.string()), ("x", pa.int64()), ("y", pa.int64()), ("_ingest_ts", ts)])
    left = pa.table({"k": ["a", "b"], "x": [1, 2], "_ingest_ts": pa.array([5_000_000, 1_000_000], pa.int64()).cast(ts)},
                    schema=ls)
    right = pa.table({"k": ["a"], "y": [7], "_ingest_ts": pa.array([3_000_000], pa.int64()).cast(ts)}, schema=rs)
    res = join_step(ls.empty_table(), rs.empty_table(), left, right, key="k",
                    cutoff=pa.scalar(2_000_000, ts), how=JoinType.LEFT, unique=Uniqueness.NONE,
                    output_schema=out_schema)
    got = {r["k"]: (r["y"], r["_ingest_ts"].timestamp()) for r in res.output.to_pylist()}
    assert got == {"a": (7, 5.0), "b": (None, 1.0)}     # the pair: max(5 s, 3 s); b expired on arrival: its own
