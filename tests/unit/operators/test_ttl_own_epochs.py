"""Property tests of the TTL rule on the rows' own epochs (docs/operators.md, docs/alignment.md "TTL under a
backlog"): the join and dedup kernels fed the way unaligned and at-least-once checkpoints feed them.

Every row has its own epoch ``p`` (>= its ingest-time epoch: late rows of an idle partition belong to a later
epoch) and is consumed in the rounds of some checkpoint ``q``: ``q = p`` (aligned), ``q > p`` (a backlog drained
by later unaligned checkpoints) or ``q = p - 1`` (at-least-once read-ahead past barrier ``q``). Each round's
expiry cutoff is ``end(L) - ttl`` with ``L`` the low watermark: the checkpoint's epoch, lowered to the own epoch of
any row not consumed yet. The brute-force models state the semantics without rounds: a pair is emitted iff
``min(t_l, t_r) >= end(max(p_l, p_r)) - ttl``, whatever the schedule; so the output is the same as aligned."""
from __future__ import annotations

import itertools
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.operators.dedup import dedup_step
from pipeline.operators.join import MATCHED, JoinType, Uniqueness, join_step
from pipeline.operators.ttl import ROW_EPOCH

pytestmark = pytest.mark.unit

E = 10
TS = pa.timestamp("us", tz="UTC")
LEFT = pa.schema([("k", pa.string()), ("lv", pa.int64()), ("_ingest_ts", TS), (ROW_EPOCH, pa.int64())])
RIGHT = pa.schema([("k", pa.string()), ("rv", pa.int64()), ("_ingest_ts", TS), (ROW_EPOCH, pa.int64())])
OUT = pa.schema([("k", pa.string()), ("lv", pa.int64()), ("rv", pa.int64()), (ROW_EPOCH, pa.int64())])


def end(m: int) -> int:
    return (m + 1) * E


# (key, ingest time, lateness in epochs: p = e + late, delay: q = p + delay, round within q)
row_st = st.tuples(st.sampled_from("abcd"), st.integers(0, 59), st.sampled_from([0, 0, 0, 1]),
                   st.sampled_from([-1, 0, 0, 0, 1, 2, 3]), st.integers(0, 1))
rows_st = st.lists(row_st, max_size=30)


def _rows(raw, start):
    """(k, t, p, q, round, id)"""
    out = []
    for i, (k, t, late, delay, rnd) in enumerate(raw):
        p = t // E + late
        out.append((k, t, p, max(0, p + delay), rnd, start + i))
    return out


def _schedule(rows):
    """Rounds in order: ((q, round), rows consumed, L)."""
    keys = sorted({(r[3], r[4]) for r in rows})
    out = []
    for q, rnd in keys:
        mine = [r for r in rows if (r[3], r[4]) == (q, rnd)]
        pending = [r for r in rows if (r[3], r[4]) >= (q, rnd)]  # this round's rows and later ones
        low = min([q] + [r[2] for r in pending])
        out.append(((q, rnd), mine, low))
    return out


def _table(rows, schema, val):
    return pa.table({"k": [r[0] for r in rows], val: [r[5] for r in rows],
                     "_ingest_ts": pa.array([r[1] for r in rows], TS), ROW_EPOCH: [r[2] for r in rows]},
                    schema=schema)


def run_join(lrows, rrows, *, ttl, how, unique=Uniqueness.NONE):
    sl = LEFT.append(pa.field(MATCHED, pa.bool_())).empty_table()
    sr = RIGHT.append(pa.field(MATCHED, pa.bool_())).empty_table()
    out = []
    last_low = 0
    for _, mine, low in _schedule(lrows + rrows):
        cutoff = pa.scalar(end(low) - ttl, TS) if ttl is not None else None
        nl = _table([r for r in mine if r[5] < 1000], LEFT, "lv")
        nr = _table([r for r in mine if r[5] >= 1000], RIGHT, "rv")
        res = join_step(sl, sr, nl, nr, key="k", cutoff=cutoff, how=how, unique=unique, output_schema=OUT,
                        ttl_us=ttl, epoch_us=E)
        sl, sr = res.left, res.right
        out.extend(tuple(r.values()) for r in res.output.to_pylist())
        last_low = low
    return out, sl, sr, last_low


def join_model(lrows, rrows, *, ttl, how, last_low):
    pairs, paired = [], set()
    for (kl, tl, pl, *_, il), (kr, tr, pr, *_, ir) in itertools.product(lrows, rrows):
        if kl == kr and (ttl is None or min(tl, tr) >= end(max(pl, pr)) - ttl):
            pairs.append((kl, il, ir, max(pl, pr)))
            paired |= {il, ir}
    out = list(pairs)

    def lone(k, t, p, i, side):
        if i in paired or ttl is None or not t < end(last_low) - ttl:
            return []
        m = max(p, (t + ttl) // E)  # the epoch in which it expires, in its own epochs' terms
        return [(k, i, None, m) if side == "left" else (k, None, i, m)]
    if how in (JoinType.LEFT, JoinType.FULL):
        out += [x for k, t, p, _, _, i in lrows for x in lone(k, t, p, i, "left")]
    if how in (JoinType.RIGHT, JoinType.FULL):
        out += [x for k, t, p, _, _, i in rrows for x in lone(k, t, p, i, "right")]
    return out


ttl_st = st.one_of(st.none(), st.integers(0, 35))


@settings(max_examples=150, deadline=None)
@given(l=rows_st, r=rows_st, how=st.sampled_from(list(JoinType)), ttl=ttl_st)
def test_join_on_own_epochs_matches_model_whatever_the_schedule(l, r, how, ttl):
    lrows, rrows = _rows(l, 0), _rows(r, 1000)
    got, sl, sr, last_low = run_join(lrows, rrows, ttl=ttl, how=how)
    assert Counter(got) == Counter(join_model(lrows, rrows, ttl=ttl, how=how, last_low=last_low))
    # state after the last round: exactly the rows not expired at the last cutoff
    alive = {i for *_, i in lrows + rrows if ttl is None or _t(lrows + rrows, i) >= end(last_low) - ttl}
    assert set(sl["lv"].to_pylist()) | set(sr["rv"].to_pylist()) == alive


def _t(rows, i):
    return next(r[1] for r in rows if r[5] == i)


@settings(max_examples=80, deadline=None)
@given(l=rows_st, r=rows_st, how=st.sampled_from(list(JoinType)), ttl=ttl_st)
def test_backlog_schedule_gives_the_aligned_output(l, r, how, ttl):
    """The defect of docs/alignment.md: consuming rows in later checkpoints (unaligned backlog) or earlier ones
    (at-least-once read-ahead) changes nothing in the pairs and outer rows, only when an outer row is emitted."""
    lrows, rrows = _rows(l, 0), _rows(r, 1000)
    aligned = [(k, t, p, p, 0, i) for k, t, p, _, _, i in lrows], [(k, t, p, p, 0, i) for k, t, p, _, _, i in rrows]
    got, _, _, low = run_join(lrows, rrows, ttl=ttl, how=how)
    ref, _, _, low_ref = run_join(*aligned, ttl=ttl, how=how)
    pairs = Counter(g for g in got if g[1] is not None and g[2] is not None)
    assert pairs == Counter(g for g in ref if g[1] is not None and g[2] is not None)
    if low == low_ref:  # both ran to the same last epoch: the same outer rows expired
        assert Counter(got) == Counter(ref)


def test_backlog_example_pairs_survive():
    """A row of epoch 0 drained in checkpoint 5 (ttl = 1.5 epochs) still meets its epoch-0 partner: held back."""
    lrows = [("a", 3, 0, 5, 0, 0)]
    rrows = [("a", 4, 0, 0, 0, 1000), ("a", 52, 5, 5, 0, 1001)]
    got, _, _, _ = run_join(lrows, rrows, ttl=15, how=JoinType.INNER)
    assert got == [("a", 0, 1000, 0)]  # not (0, 1001): min(t) = 3 < end(5) - 15


def run_dedup(rows, ttl):
    state = pa.schema([("k", pa.string()), ("_ingest_ts", TS)]).empty_table()
    schema = pa.schema([("k", pa.string()), ("v", pa.int64()), ("_ingest_ts", TS), (ROW_EPOCH, pa.int64())])
    got, dropped = [], 0
    for _, mine, low in _schedule(rows):
        t = pa.table({"k": [r[0] for r in mine], "v": [r[5] for r in mine],
                      "_ingest_ts": pa.array([r[1] for r in mine], TS), ROW_EPOCH: [r[2] for r in mine]},
                     schema=schema)
        cutoff = pa.scalar(end(low) - ttl, TS) if ttl is not None else None
        res = dedup_step(state, t, key="k", cutoff=cutoff, state_columns=["k", "_ingest_ts"], ttl_us=ttl, epoch_us=E)
        state = res.state
        dropped += res.dropped
        got += res.output["v"].to_pylist()
    return got, dropped


def dedup_model(rows, ttl):
    """Rounds in order, within a round by (key, p, t, id): y is dropped iff the last passed row x of its key has
    t_x >= end(p(y)) - ttl (and y itself is within the TTL of its own epoch)."""
    held: dict[str, int] = {}
    passed = []
    for _, mine, _ in _schedule(rows):
        for k, t, p, _, _, i in sorted(mine, key=lambda r: (r[0], r[2], r[1], r[5])):
            cut = end(p) - ttl if ttl is not None else None
            if cut is not None and t < cut:
                passed.append(i)
                continue
            if k in held and (cut is None or held[k] >= cut):
                continue
            passed.append(i)
            held[k] = t
    return passed


@settings(max_examples=150, deadline=None)
@given(raw=rows_st, ttl=ttl_st)
def test_dedup_on_own_epochs_matches_model(raw, ttl):
    rows = _rows(raw, 0)
    got, dropped = run_dedup(rows, ttl)
    want = dedup_model(rows, ttl)
    assert Counter(got) == Counter(want)
    assert len(got) + dropped == len(rows)


@settings(max_examples=80, deadline=None)
@given(raw=rows_st, ttl=ttl_st)
def test_dedup_aligned_schedule_is_the_fold_over_own_epochs(raw, ttl):
    """Aligned (q = p, one round per epoch): the batch plan's fold over processing epochs (docs/batch.md)."""
    rows = [(k, t, p, p, 0, i) for k, t, p, _, _, i in _rows(raw, 0)]
    got, _ = run_dedup(rows, ttl)
    keep, held = [], {}
    for k, t, p, _, _, i in sorted(rows, key=lambda r: (r[2], r[0], r[1], r[5])):
        c = end(p) - ttl if ttl is not None else None
        if c is not None and t < c:
            keep.append(i)
            continue
        if k in held and c is not None and held[k] < c:
            del held[k]
        if k not in held:
            keep.append(i)
            held[k] = t
    assert Counter(got) == Counter(keep)
