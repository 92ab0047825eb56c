"""Determinism under replay, the pure parts (pipeline/quality/replay.py): the row-multiset comparison, which
objects a ``process`` operator taints, the CLI flag. The replay itself: tests/batch/test_replay_determinism.py."""
from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline import Job
from pipeline.cli import build_parser
from pipeline.quality.replay import compare_tables, process_objects

pytestmark = pytest.mark.unit

S = pa.schema([("k", pa.string()), ("n", pa.int64())])


def _t(rows):
    return pa.Table.from_pylist([{"k": k, "n": n} for k, n in rows], schema=S)


def test_equal_multisets_in_any_order_are_identical():
    o = compare_tables("state/p/proc", _t([("a", 1), ("b", 2), ("a", 1)]), _t([("a", 1), ("a", 1), ("b", 2)]))
    assert o.equal and o.rows_checkpoint == o.rows_replayed == 3


def test_a_missing_duplicate_and_a_changed_value_are_counted_with_examples():
    o = compare_tables("sink/out", _t([("a", 1), ("a", 1), ("b", 2)]), _t([("a", 1), ("b", 3)]))
    assert not o.equal
    assert (o.only_checkpoint, o.only_replayed) == (2, 1)
    assert sorted((r["k"], r["n"]) for r in o.examples_checkpoint) == [("a", 1), ("b", 2)]
    assert [(r["k"], r["n"]) for r in o.examples_replayed] == [("b", 3)]
    assert "sink/out of chk-7 differs" in o.describe("chk-7")


def test_columns_in_another_order_compare_and_another_schema_differs():
    a = _t([("a", 1)])
    assert compare_tables("x", a, a.select(["n", "k"])).equal
    other = pa.table({"k": ["a"], "m": [1]})
    assert not compare_tables("x", a, other).equal
    assert compare_tables("x", pa.table({}), pa.table({})).equal


def test_process_taints_its_state_and_everything_downstream_only():
    src = pa.schema([("k", pa.string()), ("x", pa.float64()), ("_ingest_ts", pa.timestamp("us", tz="UTC"))])
    job = Job("taint", max_parallelism=4)
    a = job.source("a", src, key="k")
    p = a.process(uid="p", key="k", fn=lambda r, s: (s, r), state_schema=pa.schema([("k", pa.string())]),
                  output_schema=src)
    p.sink("raw")
    p.aggregate(uid="agg", key="k", aggs={"n": ("count", None)}).sink("per_k", mode="upsert")
    a.aggregate(uid="clean", key="k", aggs={"n": ("count", None)}).sink("clean_k", mode="upsert")
    assert process_objects(job) == {"state/p", "state/agg", "sink/raw", "sink/per_k"}


def test_cli_replay_flag():
    parse = build_parser().parse_args
    assert parse(["validate", "--job", "j"]).replay is None
    assert parse(["validate", "--job", "j", "--replay"]).replay is True
    assert parse(["validate", "--job", "j", "--no-replay"]).replay is False
