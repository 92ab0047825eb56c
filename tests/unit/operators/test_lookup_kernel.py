"""Property test of the lookup join's kernel against a brute-force model (pure pyarrow): SQL equality (a null key
matches nothing), every side row of an equal key, ``left`` keeping an unmatched row once with nulls."""
from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.exceptions import ConfigError
from pipeline.operators.lookup import SideTable, SideTableFormat, lookup_rows

pytestmark = pytest.mark.unit

keys = st.one_of(st.none(), st.integers(0, 5))


def model(rows, side, how):
    out = []
    for k, x in rows:
        hits = [v for sk, v in side if k is not None and sk is not None and sk == k]
        out += [(k, x, v) for v in hits] or ([(k, x, None)] if how == "left" else [])
    return Counter(out)


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.tuples(keys, st.integers(0, 1000)), max_size=30),
       side=st.lists(st.tuples(keys, st.text("abc", max_size=3)), max_size=12),
       how=st.sampled_from(["inner", "left"]))
def test_kernel_matches_the_model(rows, side, how):
    r = pa.table({"k": pa.array([k for k, _ in rows], pa.int64()), "x": pa.array([x for _, x in rows], pa.int64())})
    s = pa.table({"key": pa.array([k for k, _ in side], pa.int32()), "v": pa.array([v for _, v in side], pa.string())})
    out = lookup_rows(r, s, "k", "key", how, ("v",))
    assert out.column_names == ["k", "x", "v"]
    assert out.schema.field("k").type == pa.int64()
    assert Counter(zip(*(out.column(c).to_pylist() for c in ("k", "x", "v")))) == model(rows, side, how)


def test_incomparable_keys_are_a_clear_error():
    r = pa.table({"k": ["x"]})
    s = pa.table({"key": pa.array([1], pa.int64()), "v": ["a"]})
    with pytest.raises(ConfigError, match="cannot be compared"):
        lookup_rows(r, s, "k", "key", "inner", ("v",))


def test_side_table_references():
    assert SideTable.parse("delta:s3://b/t", "x") == SideTable(SideTableFormat.DELTA, "s3://b/t")
    assert SideTable.parse("parquet:side/t", "x").resolved("file:///src/") == SideTable(
        SideTableFormat.PARQUET, "file:///src/side/t")
    assert SideTable.parse("iceberg:/abs/t", "x").resolved("s3://b/src").uri == "file:///abs/t"
    for bad in ("csv:/x", "delta:", "/x/y"):
        with pytest.raises(ConfigError, match="parquet:<uri>"):
            SideTable.parse(bad, "lookup_join 'j'")
