"""The keys the operator kernels report as touched cover every state change: the touched-key diff equals the
full diff, round after round (random joins with TTL and uniqueness, dedup with TTL), without relying on the
row-count fallback of :func:`pipeline.state.changelog.diff_touched`."""
from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pipeline.operators.dedup import dedup_step
from pipeline.operators.join import JoinType, Uniqueness, join_step, with_matched
from pipeline.state.changelog import TouchedKeys, _net_ops, diff

pytestmark = pytest.mark.unit

TS = pa.timestamp("us", tz="UTC")
LEFT = pa.schema([("k", pa.string()), ("lv", pa.int64()), ("_ingest_ts", TS)])
RIGHT = pa.schema([("k", pa.string()), ("rv", pa.int64()), ("_ingest_ts", TS)])
OUT = pa.schema([("k", pa.string()), ("lv", pa.int64()), ("rv", pa.int64())])


def _rows(rng, schema, val, n, t0):
    return pa.table({"k": [f"k{rng.randrange(12)}" for _ in range(n)], val: [rng.randrange(5) for _ in range(n)],
                     "_ingest_ts": pa.array([t0 + rng.randrange(10) for _ in range(n)], TS)}, schema=schema)


def _restricted_diff(old, new, touched):
    """The touched-key diff without the fallback: what the hint alone yields."""
    keys = touched.values(new.schema.field(touched.column).type)
    return diff(old.filter(pc.is_in(old[touched.column], value_set=keys)),
                new.filter(pc.is_in(new[touched.column], value_set=keys)))


@pytest.mark.parametrize("seed", range(12))
def test_join_touched_keys_cover_every_state_change(seed):
    rng = random.Random(seed)
    how = rng.choice(list(JoinType))
    unique = rng.choice(list(Uniqueness))
    sl = sr = None
    for rnd in range(8):
        nl, nr = _rows(rng, LEFT, "lv", rng.randrange(0, 6), rnd * 10), _rows(rng, RIGHT, "rv", rng.randrange(0, 6),
                                                                                rnd * 10)
        if sl is None:
            sl, sr = with_matched(nl.slice(0, 0)), with_matched(nr.slice(0, 0))
        cutoff = pa.scalar(rnd * 10 - 15, TS) if rng.random() < 0.7 else None
        res = join_step(sl, sr, nl, nr, key="k", cutoff=cutoff, how=how, unique=unique, output_schema=OUT)
        for old, new in ((sl, res.left), (sr, res.right)):
            d = _restricted_diff(old, new, TouchedKeys("k", res.touched))
            assert d.equals(diff(old, new)), (seed, rnd)
            assert old.num_rows + _net_ops(d) == new.num_rows
        sl, sr = res.left, res.right


@pytest.mark.parametrize("seed", range(8))
def test_dedup_touched_keys_cover_every_state_change(seed):
    rng = random.Random(seed)
    cols = ["k", "_ingest_ts"]
    state = pa.schema([("k", pa.string()), ("_ingest_ts", TS)]).empty_table()
    for rnd in range(8):
        new = _rows(rng, LEFT, "lv", rng.randrange(0, 8), rnd * 10)
        cutoff = pa.scalar(rnd * 10 - 15, TS) if rng.random() < 0.7 else None
        res = dedup_step(state, new, key="k", cutoff=cutoff, state_columns=cols)
        keys = (new["k"],) + ((res.expired_keys,) if res.expired_keys is not None else ())
        d = _restricted_diff(state, res.state, TouchedKeys("k", keys))
        assert d.equals(diff(state, res.state)), (seed, rnd)
        state = res.state
