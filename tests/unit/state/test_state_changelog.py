"""Changelog diffs (Arrow multiset difference by all columns) and applying them back."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from pipeline.exceptions import CorruptCheckpointError
from pipeline.state.attempts import canonical_order
from pipeline.state.changelog import OP_COLUMN, TouchedKeys, apply_changelog, can_diff, diff, diff_touched

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.float64()), ("d", pa.decimal128(38, 9)),
                    ("ts", pa.timestamp("us", tz="UTC")), ("m", pa.bool_()), ("_kg", pa.int32())])


def _table(rows):
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def _rand_rows(rng, n):
    return [{"k": f"k{rng.randrange(50)}", "v": rng.choice([1.5, -0.5, None, float(rng.randrange(5))]),
             "d": rng.randrange(100), "ts": rng.randrange(10**6), "m": rng.choice([True, False, None]),
             "_kg": rng.randrange(8)} for _ in range(n)]


@pytest.mark.parametrize("seed", range(8))
def test_diff_then_apply_gives_the_new_table_exactly(seed):
    rng = random.Random(seed)
    old_rows = _rand_rows(rng, rng.randrange(0, 200))
    new_rows = [r for r in old_rows if rng.random() < 0.7] + _rand_rows(rng, rng.randrange(0, 50))
    new_rows += new_rows[: rng.randrange(0, 5)]  # duplicates: a multiset, not a set
    old, new = _table(old_rows), _table(new_rows)
    d = diff(old, new)
    assert set(d.column_names) == set(SCHEMA.names) | {OP_COLUMN}
    assert apply_changelog(canonical_order(old), [d]).equals(canonical_order(new))


def test_delta_holds_only_what_changed():
    old = _table([{"k": f"k{i}", "v": 1.0, "d": 1, "ts": 1, "m": True, "_kg": 0} for i in range(1000)])
    new = _table(old.to_pylist()[1:] + [{"k": "new", "v": 2.0, "d": 2, "ts": 2, "m": False, "_kg": 1}])
    d = diff(old, new)
    assert d.num_rows == 2
    assert sorted(zip(d["k"].to_pylist(), d[OP_COLUMN].to_pylist())) == [("k0", -1), ("new", 1)]
    assert diff(new, new).num_rows == 0


def test_chain_of_many_deltas_equals_the_last_snapshot():
    rng = random.Random(7)
    snaps = [_table(_rand_rows(rng, 100))]
    for _ in range(6):
        prev = snaps[-1].to_pylist()
        snaps.append(_table([r for r in prev if rng.random() < 0.9] + _rand_rows(rng, 20)))
    deltas = [diff(a, b) for a, b in zip(snaps, snaps[1:])]
    assert apply_changelog(canonical_order(snaps[0]), deltas).equals(canonical_order(snaps[-1]))


def test_delta_that_does_not_belong_to_the_base_is_refused():
    base = _table(_rand_rows(random.Random(1), 10))
    foreign = diff(_table([{"k": "zz", "v": 0.0, "d": 0, "ts": 0, "m": True, "_kg": 0}]), base.slice(0, 0))
    with pytest.raises(CorruptCheckpointError, match="does not hold"):
        apply_changelog(base, [foreign], what="checkpoint chk-3: state chain X")


def test_nested_columns_are_not_diffed():
    assert can_diff(SCHEMA)
    assert not can_diff(pa.schema([("k", pa.string()), ("xs", pa.list_(pa.int64()))]))


@pytest.mark.parametrize("seed", range(8))
def test_diff_of_touched_keys_equals_the_full_diff(seed):
    """Operators name the keys they touched (input keys + expired ones): the delta is the full diff's, in any row
    order of the new table (it is not canonicalised before the diff)."""
    rng = random.Random(seed)
    old = _table(_rand_rows(rng, rng.randrange(1, 200)))
    touched = {f"k{rng.randrange(50)}" for _ in range(rng.randrange(0, 8))}
    kept = [r for r in old.to_pylist() if r["k"] not in touched or rng.random() < 0.5]
    added = [r for r in _rand_rows(rng, rng.randrange(0, 40)) if r["k"] in touched]
    new_rows = kept + added
    rng.shuffle(new_rows)
    new = _table(new_rows)
    keys = pa.array(sorted(touched) + sorted(touched)[:1], pa.string())  # duplicates in the hint are harmless
    d = diff_touched(old, new, TouchedKeys("k", (keys,)))
    assert d.equals(diff(old, new))
    assert apply_changelog(canonical_order(old), [d]).equals(canonical_order(new))


def test_a_hint_contradicted_by_the_row_counts_falls_back_to_the_full_diff():
    old = _table([{"k": "a", "_kg": 1}, {"k": "b", "_kg": 2}, {"k": "c", "_kg": 3}])
    new = _table([{"k": "a", "_kg": 1}, {"k": "d", "_kg": 4}])  # b and c left, d came: the hint names only d
    d = diff_touched(old, new, TouchedKeys("k", (pa.array(["d"]),)))
    assert d.equals(diff(old, new))
    assert apply_changelog(old, [d]).equals(canonical_order(new))
    same = diff_touched(old, old, TouchedKeys("k", ()))
    assert same.num_rows == 0
